"""Accounts benchmark (issue 28): what authentication costs the polling route.

    .venv/bin/python bench/accounts.py                 # 4 rounds of 10 s per side
    .venv/bin/python bench/accounts.py --rounds 2 --seconds 5

Two real `finetune-studio serve` processes on this machine, each with one finished
tiny-model job: one in single-user mode (loopback, no key), one with accounts on, where
a user polls their own job with their API key (`Authorization: Bearer fts-...`: an HMAC,
one indexed read, cached, then the owner check of the job's id). wrk (1 thread, 8
connections, as bench/run.py's polling row) saturates `GET /train/status/{id}` on one
server, then the other, in rounds whose order reverses every round.

Budget (issue 28): with accounts, at least 0.95 of the requests per second without them,
on medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DEMO_DATA, job_request, load_average, machine_line, median, server, table, tiny_model, verdict  # noqa: E402

BUDGET = 0.95
TOKEN = "bench-admin-token-0123456789abcdef"  # noqa: S105 (a throwaway server's)
CONNECTIONS = 8


def finished_job(url: str, model: Path, headers: dict[str, str]) -> str:
    """A 1-step job, run to its end (its status is what the pollers read)."""
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        answer = http.post("/train/start", json=job_request(model, max_steps=1))
        answer.raise_for_status()
        job_id = str(answer.json()["job_id"])
        with http.stream("GET", f"/train/stream/{job_id}") as stream:
            for line in stream.iter_lines():
                if line.startswith("data: ") and any(f'"phase":"{end}"' in line.replace(" ", "")
                                                     for end in ("completed", "error", "stopped")):
                    break
        return job_id


def user_key(url: str) -> str:
    """A user made by the admin (FINETUNE_STUDIO_TOKEN), and a `read` key of theirs."""
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=url, headers=admin, timeout=30) as http:
        http.post("/auth/users", json={"name": "poller", "password": "poller-password-1"}).raise_for_status()
        made = http.post("/auth/keys", json={"name": "bench", "scopes": ["read", "train"], "user": "poller"})
        made.raise_for_status()
        return str(made.json()["key"])


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk_run(wrk: str, target: str, seconds: int, headers: dict[str, str], pid: int) -> tuple[float, float]:
    """(requests per second, the server's CPU microseconds per request) of one wrk run."""
    flags = [arg for name, value in headers.items() for arg in ("-H", f"{name}: {value}")]
    before = cpu_seconds(pid)
    output = subprocess.run([wrk, "-t1", f"-c{CONNECTIONS}", f"-d{seconds}s", *flags, target],
                            check=True, capture_output=True, text=True).stdout
    spent = cpu_seconds(pid) - before
    if "Non-2xx" in output:
        sys.exit(f"wrk got refusals from {target}:\n{output}")
    requests = int(next(line.split()[0] for line in output.splitlines() if "requests in" in line))
    rps = float(next(line.split()[1] for line in output.splitlines() if line.startswith("Requests/sec")))
    return rps, spent / max(1, requests) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of (single-user, accounts), order reversed every round")
    parser.add_argument("--seconds", type=int, default=10, help="seconds of wrk per side and round (default 10)")
    args = parser.parse_args()
    wrk = shutil.which("wrk")
    if wrk is None:
        sys.exit("wrk is not installed (apt-get install wrk)")
    print(machine_line())
    print(load_average("before") + "\n", flush=True)
    results: dict[str, list[float]] = {"single-user": [], "accounts": []}
    cpu: dict[str, list[float]] = {"single-user": [], "accounts": []}
    with tempfile.TemporaryDirectory(prefix="finetune-studio-bench-accounts-") as tmp:
        work = Path(tmp)
        model = tiny_model(work)
        roots = os.pathsep.join(str(path) for path in (work, DEMO_DATA.parent))
        accounts_env = {"FINETUNE_STUDIO_ACCOUNTS": "true", "FINETUNE_STUDIO_TOKEN": TOKEN,
                        "FINETUNE_STUDIO_ALLOWED_ROOTS": roots}
        with server(work / "single") as (single_url, single), \
                server(work / "accounts", env=accounts_env) as (accounts_url, accounting):
            key = user_key(accounts_url)
            sides = {
                "single-user": (f"{single_url}/train/status/{finished_job(single_url, model, {})}", {}, single.pid),
                "accounts": (f"{accounts_url}/train/status/"
                             f"{finished_job(accounts_url, model, {'Authorization': f'Bearer {key}'})}",
                             {"Authorization": f"Bearer {key}"}, accounting.pid),
            }
            for target, headers, pid in sides.values():  # warm-up
                wrk_run(wrk, target, 2, headers, pid)
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
                for side in order:
                    target, headers, pid = sides[side]
                    rps, micros = wrk_run(wrk, target, args.seconds, headers, pid)
                    results[side].append(rps)
                    cpu[side].append(micros)
                    print(f"  round {round_ + 1}: {side} {rps:,.0f} req/s, {micros:.0f} us of server CPU a request", flush=True)
    single, accounts = median(results["single-user"]), median(results["accounts"])
    ratio = accounts / single
    rounds = [a / s for s, a in zip(results["single-user"], results["accounts"], strict=True)]
    rows = [
        ("single-user mode: requests per second", f"{single:,.0f}", "", ""),
        ("accounts on, a user's API key: requests per second", f"{accounts:,.0f}", "", ""),
        ("accounts / single-user", f"{ratio:.3f}", f">= {BUDGET}", verdict(ratio >= BUDGET)),
        ("the same, median of the rounds' own ratios", f"{median(rounds):.3f}", "", ""),
        ("server CPU a request, single-user / accounts", f"{median(cpu['single-user']):.0f} / {median(cpu['accounts']):.0f} us",
         "", ""),
        ("CPU a request, single-user / accounts (the throughput ratio on a quiet machine)",
         f"{median(cpu['single-user']) / median(cpu['accounts']):.3f}", "", "reported"),
    ]
    print(table(f"Polling GET /train/status/{{id}} with and without accounts (wrk, 1 thread, {CONNECTIONS} connections, "
                f"{args.seconds} s, {args.rounds} rounds, medians)", rows))
    print(load_average("after"))


if __name__ == "__main__":
    main()
