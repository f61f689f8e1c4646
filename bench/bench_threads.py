"""Wall time of torch's thread counts and wait policies: the demo's commands, and models of four
sizes, at one thread against every core, on an idle machine and beside a busy job.

    python bench/bench_threads.py                         # both parts, idle and busy (~30 min)
    python bench/bench_threads.py --part demo --busy no   # the demo's commands, idle only
    python bench/bench_threads.py --part sweep            # the model sizes

What sets `otb_diag/runtime/threads.py:SMALL_MODEL` (the sweep) and what the README's demo
times are (the demo part). Every number is measured in a fresh process: libgomp reads its wait
policy, and torch its thread count, when torch loads.

demo: the commands of the Makefile's `demo` target, read from the Makefile itself (so the bench
times what `make demo` runs), in that order, under each `--settings` (in turn, command by
command, each setting in its own temporary folder):
`auto` (the command line's default: no thread variable set), `one` (`OMP_NUM_THREADS=1`),
`cores-spin` (`OMP_NUM_THREADS=<cores>` and libgomp's default spinning, `GOMP_SPINCOUNT=300000`:
torch's default before issue 53) and `cores-passive` (`OMP_NUM_THREADS=<cores>`, the passive
waits the command line now sets). `--busy yes` runs a second job beside them, a Python busy loop
(one core), started before the first command and stopped after the last.

sweep: seeded random models, as the lab's toy (GPT-2, 128 wide, 3 layers, 22 tokens: 0.6 M
parameters), GPT-2 256 wide (3.4 M), GPT-2 512 wide (21 M) and SmolLM2-135M's shape (Llama, 576
wide, 30 layers, 49,152 tokens: 135 M; its timings do not depend on its weights, so none is
downloaded), each on three fixed shapes of work: `score` (a no-grad forward of 8 x 64 tokens and
its log-softmax: energy's pass), `update` (forward and backward of 4 x 64 tokens: a training
step) and `sample` (16 rows, 8 prompt tokens, 8 new ones with the KV cache: train's sampling);
the median of `--reps` after a warm-up, each repeated to at least 0.2 s. At one thread, at every
core with passive waits, and with spinning ones. Beside the wall times' ratios, `idle x one`:
the CPU time of the longer thread path at every core over one thread's CPU time, the best a
second thread could do on idle cores, read off a busy machine (`_timed`). Its last line says
where `SMALL_MODEL` belongs by the wall times without the busy job.

Prints each table with the 1-minute load average beside each row, then one JSON line with every
number. Wall times beside other work say little: the load column says how busy the machine was
(`--nice -10`, as root, puts the measured processes ahead of other jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from subprocess import Popen

from otb_diag.runtime.threads import SMALL_MODEL, allowed_cores

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent / "otb-diag"
CORES = allowed_cores()
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
SPIN = {"GOMP_SPINCOUNT": "300000"}  # libgomp's default when no wait variable is set
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
# The demo part's settings: the thread variables each sets (every other one of THREAD_VARS is
# removed from the commands' environment).
SETTINGS = {
    "auto": {},
    "one": {"OMP_NUM_THREADS": "1"},
    "cores-spin": {"OMP_NUM_THREADS": str(CORES), **SPIN},
    "cores-passive": {"OMP_NUM_THREADS": str(CORES)},
}
# The sweep's: threads and wait policy of the child (plain Python: nothing sets them for it).
SWEEP_SETTINGS = {
    "one": {"OMP_NUM_THREADS": "1", **PASSIVE},
    "cores-passive": {"OMP_NUM_THREADS": str(CORES), **PASSIVE},
    "cores-spin": {"OMP_NUM_THREADS": str(CORES), **SPIN},
}
MODELS = {
    "toy": ("gpt2", {"n_embd": 128, "n_layer": 3, "n_head": 4, "vocab_size": 22}),
    "gpt2-256": ("gpt2", {"n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 512}),
    "gpt2-512": ("gpt2", {"n_embd": 512, "n_layer": 6, "n_head": 8, "vocab_size": 4096}),
    "smollm2-shape": (
        "llama",
        {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
         "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152,
         "tie_word_embeddings": True},
    ),
}  # fmt: skip
# --tiny (tests/bench/): the smallest path, every command's work cut down.
TINY_ARGS = {
    "variance-compare": ["--mode", "proxy", "--draws", "2", "--bootstrap", "10"],
    "train": ["--updates", "1", "--prompts-per-step", "1", "--group-size", "2"],
}


def demo_commands(makefile: Path = ROOT / "Makefile") -> list[list[str]]:
    """The `otb-diag` command lines of the Makefile's `demo` target, without the program."""
    text = makefile.read_text(encoding="utf-8")
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe, "no demo target in the Makefile"
    lines = [shlex.split(line) for line in recipe.group(1).splitlines()]
    return [words[1:] for words in lines if words[0].endswith("/otb-diag")]


def _in(folder: Path, args: list[str]) -> list[str]:
    """`args` with the demo's relative `out/...` paths under `folder`."""
    return [str(folder / a) if a.startswith("out/") else a for a in args]


def _environment(setting: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARS}
    return {**env, **setting}


def _niced(nice: int):
    """`subprocess` keyword: the child at priority `nice` (negative: ahead of the other jobs on
    a shared machine, an approximation of idle cores; needs root)."""
    return {"preexec_fn": (lambda: os.setpriority(os.PRIO_PROCESS, 0, nice))} if nice else {}


def _busy_job(nice: int) -> Popen:
    """A second job: a Python busy loop on one core, at the measured children's priority."""
    return Popen([sys.executable, "-c", "while True: pass"], **_niced(nice))


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_demo(
    settings: list[str], busy: list[bool], tiny: bool, nice: int = 0, commands: int | None = None
) -> list[dict]:
    """One row per command (the first `commands` of the demo's, all where None), setting and
    busy state: wall and CPU seconds, the load before it, and the count the command said it
    chose (`--threads auto: ...` on stderr). Each setting
    runs the demo in its own folder, command by command in turn with the other settings (each
    command's settings meet nearly the same load on a shared machine); the busy job, where
    asked, runs through all of them."""
    rows = []
    for with_busy in busy:
        job = _busy_job(nice) if with_busy else None
        try:
            with tempfile.TemporaryDirectory() as tmp:
                for args in demo_commands()[:commands]:
                    for name in settings:
                        folder = Path(tmp) / name
                        rows.append(_time_command(folder, args, name, with_busy, tiny, nice))
        finally:
            if job is not None:
                job.kill()
                job.wait()
    return rows


def _time_command(
    folder: Path, args: list[str], setting: str, busy: bool, tiny: bool, nice: int
) -> dict:
    args = _in(folder, args) + (TINY_ARGS.get(args[0], []) if tiny else [])
    load, cpu, t0 = os.getloadavg()[0], _children_cpu(), time.perf_counter()
    out = subprocess.run(
        [str(BIN), *args],
        env=_environment(SETTINGS[setting]),
        capture_output=True,
        text=True,
        **_niced(nice),
    )
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu
    if out.returncode != 0:
        raise SystemExit(f"{shlex.join(args)} failed ({out.returncode}):\n{out.stderr}")
    said = [line for line in (out.stderr or "").splitlines() if line.startswith("--threads auto")]
    row = {"command": _label(args), "setting": setting, "busy": busy, "wall_s": wall, "cpu_s": cpu}
    return {**row, "load": load, "said": said[0] if said else ""}


def _label(args: list[str]) -> str:
    """The command's name: `rollouts inspect`, `energy`."""
    words = [a for a in args[:2] if re.fullmatch(r"[a-z-]+", a)]
    return " ".join(words if args[0] in ("rollouts", "lab") else words[:1])


def run_sweep(
    models: list[str], settings: list[str], busy: list[bool], reps: int, nice: int = 0
) -> list[dict]:
    """One row per model, setting and busy state, the workloads' median seconds in each."""
    rows = []
    for with_busy in busy:
        job = _busy_job(nice) if with_busy else None
        try:
            for model in models:
                for name in (s for s in SWEEP_SETTINGS if s in settings):
                    load = os.getloadavg()[0]
                    out = subprocess.run(
                        [sys.executable, __file__, "--child", model, "--reps", str(reps)],
                        env=_environment(SWEEP_SETTINGS[name]),
                        capture_output=True,
                        text=True,
                        check=True,
                        **_niced(nice),
                    )
                    measured = json.loads(out.stdout.strip().splitlines()[-1])
                    rows.append(
                        {"model": model, "setting": name, "busy": with_busy, "load": load,
                         **measured}
                    )  # fmt: skip
        finally:
            if job is not None:
                job.kill()
                job.wait()
    return rows


def child(model_name: str, reps: int) -> None:
    """In a fresh process (its thread variables set by the parent): the median seconds of each
    workload on a seeded random model, as one JSON line."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    kind, fields = MODELS[model_name]
    config = AutoConfig.for_model(kind, **fields, n_positions=256, pad_token_id=0)
    model = AutoModelForCausalLM.from_config(config).float()
    vocab = config.vocab_size

    def score() -> None:
        with torch.no_grad():
            model(torch.randint(1, vocab, (8, 64))).logits.float().log_softmax(-1)

    def update() -> None:
        model.zero_grad()
        model(torch.randint(1, vocab, (4, 64))).logits.float().logsumexp(-1).mean().backward()

    def sample() -> None:
        with torch.no_grad():
            model.generate(
                torch.randint(1, vocab, (16, 8)),
                attention_mask=torch.ones(16, 8, dtype=torch.long),
                max_new_tokens=8,
                min_new_tokens=8,
                do_sample=True,
                pad_token_id=0,
            )

    timed = {name: _timed(fn, reps) for name, fn in
             (("score", score), ("update", update), ("sample", sample))}  # fmt: skip
    parameters = sum(p.numel() for p in model.parameters())
    print(json.dumps({"parameters": parameters, "threads": torch.get_num_threads(), **timed}))


def _timed(fn, reps: int) -> dict[str, float]:
    """Seconds a call, medians of `reps` timings after a warm-up (each repeats `fn` until 0.2 s
    have passed: the toy's calls take milliseconds): `wall`; `cpu`, this process's CPU time;
    and `path`, the larger of the calling thread's CPU time and the other threads' together.
    With passive waits a waiting thread uses no CPU, so on idle cores a call takes at least
    `path` (the calling thread runs the serial part and its share; the others, theirs), and one
    thread takes `cpu`: `path` over one thread's `cpu` is the best a second thread could do
    there, measured without idle cores (CPU time barely moves with the load, wall time does)."""
    fn()
    samples = []
    for _ in range(reps):
        calls, wall, cpu, main = 0, time.perf_counter(), time.process_time(), time.thread_time()
        while time.perf_counter() - wall < 0.2 or calls == 0:
            fn()
            calls += 1
        cpu, main = time.process_time() - cpu, time.thread_time() - main
        wall = time.perf_counter() - wall
        samples.append((wall / calls, cpu / calls, max(main, cpu - main) / calls))
    return {key: statistics.median(s[i] for s in samples) for i, key in
            enumerate(("wall", "cpu", "path"))}  # fmt: skip


def _ratio(value: float, one: float | None) -> str:
    return f"{value / one:.2f}" if one else "-"


def print_demo(rows: list[dict]) -> None:
    print("\n## demo: the Makefile's demo commands (ratio: wall / wall at one thread)")
    print(f"{'command':<18}{'setting':<15}{'busy':<6}{'wall s':>8}{'cpu s':>8}{'load':>7}"
          f"{'x one':>7}  auto chose")  # fmt: skip
    one = {(r["command"], r["busy"]): r["wall_s"] for r in rows if r["setting"] == "one"}
    totals: dict[tuple[str, bool], float] = {}
    for r in rows:
        key = (r["setting"], r["busy"])
        totals[key] = totals.get(key, 0.0) + r["wall_s"]
        ratio = _ratio(r["wall_s"], one.get((r["command"], r["busy"])))
        busy = "yes" if r["busy"] else "no"
        print(f"{r['command']:<18}{r['setting']:<15}{busy:<6}{r['wall_s']:>8.1f}"
              f"{r['cpu_s']:>8.1f}{r['load']:>7.2f}{ratio:>7}  {r['said']}")  # fmt: skip
    for (setting, busy), total in totals.items():
        ratio = _ratio(total, totals.get(("one", busy)))
        print(f"{'total':<18}{setting:<15}{'yes' if busy else 'no':<6}{total:>8.1f}"
              f"{'':>15}{ratio:>7}")  # fmt: skip


def print_sweep(rows: list[dict]) -> None:
    print("\n## sweep: wall seconds a call; x one: wall / wall at one thread; idle x one: the "
          "critical CPU path / one thread's CPU (see _timed)")  # fmt: skip
    print(f"{'model':<15}{'params':>9}{'setting':>15}{'busy':>6}{'load':>7}"
          f"{'score':>9}{'update':>9}{'sample':>9}  x one (score update sample)"
          "  idle x one")  # fmt: skip
    one = {(r["model"], r["busy"]): r for r in rows if r["setting"] == "one"}
    for r in rows:
        base = one.get((r["model"], r["busy"]))
        work = ("score", "update", "sample")
        ratios = " ".join(_ratio(r[w]["wall"], base and base[w]["wall"]) for w in work)
        idle = " ".join(_ratio(r[w]["path"], base and base[w]["cpu"]) for w in work)
        print(f"{r['model']:<15}{r['parameters'] / 1e6:>8.1f}M{r['setting']:>15}"
              f"{'yes' if r['busy'] else 'no':>6}{r['load']:>7.2f}{r['score']['wall']:>9.4f}"
              f"{r['update']['wall']:>9.4f}{r['sample']['wall']:>9.4f}  {ratios}"
              f"  {idle}")  # fmt: skip
    print(threshold_line(rows))


def threshold_line(rows: list[dict]) -> str:
    """Where `SMALL_MODEL` belongs by this run's wall times without the busy job: above the
    largest model that every core (passive waits) did not beat one thread on every workload,
    at or below the smallest one above it that it did."""
    idle = {(r["model"], r["setting"]): r for r in rows if not r["busy"]}
    beat = {}
    for (model, setting), r in idle.items():
        one = idle.get((model, "one"))
        if setting == "cores-passive" and one:
            work = ("score", "update", "sample")
            beat[r["parameters"]] = all(r[w]["wall"] < one[w]["wall"] for w in work)
    if not beat:
        return "SMALL_MODEL: no idle one / cores-passive pair measured"
    losing = [p for p, won in beat.items() if not won]
    above = [p for p, won in beat.items() if won and p > max(losing, default=0)]
    low = f"{max(losing) / 1e6:.1f} M" if losing else "-"
    high = f"{min(above) / 1e6:.1f} M" if above else "-"
    return (
        f"SMALL_MODEL (now {SMALL_MODEL / 1e6:g} M) belongs above {low} parameters and "
        f"at or below {high} (from there up, every core beat one thread at each workload)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("demo", "sweep", "both"), default="both")
    parser.add_argument("--busy", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="of " +
                        ", ".join(SETTINGS) + " (the sweep has no auto)")  # fmt: skip
    parser.add_argument("--nice", type=int, default=0, help="the children's priority (root: "
                        "negative puts them ahead of other jobs)")  # fmt: skip
    parser.add_argument("--models", default=",".join(MODELS), help=", ".join(MODELS))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--commands", type=int, default=None, help="time the first N of the "
                        "demo's commands (each needs those before it; default: all)")  # fmt: skip
    parser.add_argument("--tiny", action="store_true", help="smallest path (tests/bench/)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args.reps)
    busy = {"no": [False], "yes": [True], "both": [False, True]}[args.busy]
    print(f"machine: {CORES} cores for this process, 1-min load average "
          f"{os.getloadavg()[0]:.2f}, children at nice {args.nice}")  # fmt: skip
    record: dict = {"cores": CORES, "load_average": os.getloadavg(), "nice": args.nice}
    settings = args.settings.split(",")
    if args.part in ("sweep", "both"):
        record["sweep"] = run_sweep(args.models.split(","), settings, busy, args.reps, args.nice)
        print_sweep(record["sweep"])
    if args.part in ("demo", "both"):
        record["demo"] = run_demo(settings, busy, args.tiny, args.nice, args.commands)
        print_demo(record["demo"])
    print(json.dumps(record))


if __name__ == "__main__":
    main()
