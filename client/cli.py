"""The `codedgd` command line.

    codedgd run            a coordinator and N worker processes on this machine, one job
    codedgd coordinator    serve a coordinator (workers and clients dial in)
    codedgd worker         serve as a worker of a coordinator
    codedgd submit         submit a job to a running coordinator (and watch it)
    codedgd watch          follow a job's rounds
    codedgd status         jobs and workers of a coordinator
    codedgd cancel         cancel a job
    codedgd policies       the aggregation policies and their parameters
    codedgd simulate       the same job on a virtual clock (client/sim_cli.py)
    codedgd report         plots and tables from result files (client/sim_cli.py)
    codedgd health         container healthcheck probe (client/health.py)

Every error a user can cause prints one line naming the fix (exit status 2);
never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from codedgd.services.errors import CodedGDError, ConfigError, JobFailed
from codedgd.services.job import Component, JobConfig
from codedgd.services.reports import RoundRecord, write_results

DEFAULT_ADDRESS = "127.0.0.1:50051"
EPILOG = (
    "Every --flag-name also reads its default from the environment variable "
    "CODEDGD_FLAG_NAME (a flag on the command line wins), except --verbose and the "
    "repeatable --param, --data-opt and --straggler-opt. "
    "Documentation: README.md and docs/ in the codedgd repository."
)
ENV_PREFIX = "CODEDGD_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_name(option: str) -> str:
    """``--metrics-port`` → ``CODEDGD_METRICS_PORT``."""
    return ENV_PREFIX + option.lstrip("-").upper().replace("-", "_")


def apply_env_defaults(
    parser: argparse.ArgumentParser, environ: Mapping[str, str] | None = None
) -> dict[str, ConfigError]:
    """Give every long option of every subcommand its default from CODEDGD_<NAME>.

    Containers and cloud-init configure the services this way. A value that does not
    parse is not applied; its error, naming the variable, comes back under its
    subcommand's name ("" for the top level) so that only the command that has the
    option refuses to start (:func:`check_env`): a bad CODEDGD_WORKERS must not break
    `codedgd policies` or `--help`.
    """
    env = os.environ if environ is None else environ
    parsers: list[tuple[str, argparse.ArgumentParser]] = [("", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.extend(action.choices.items())
    errors: dict[str, ConfigError] = {}
    for command, p in parsers:
        for action in p._actions:
            longs = [o for o in action.option_strings if o.startswith("--")]
            if not longs or action.dest in ("help", "verbose"):
                continue
            name = env_name(longs[0])
            if name not in env:
                continue
            raw = env[name]
            if isinstance(action, argparse._StoreTrueAction | argparse.BooleanOptionalAction) or (
                action.nargs == 0 and action.const is True
            ):
                if raw.strip().lower() not in _TRUE | _FALSE:
                    errors.setdefault(
                        command,
                        ConfigError(f"{name}={raw!r}: expected one of 1/0, true/false, yes/no"),
                    )
                    continue
                action.default = raw.strip().lower() in _TRUE
                continue
            if isinstance(action, argparse._AppendAction) or action.nargs not in (None, "?"):
                continue  # repeatable and list-valued flags (e.g. --param): command line only
            try:
                action.default = action.type(raw) if callable(action.type) else raw
            except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
                errors.setdefault(
                    command, ConfigError(f"{name}={raw!r} is not valid for {longs[0]}: {exc}")
                )
    return errors


def check_env(errors: Mapping[str, ConfigError], command: str) -> None:
    """Raise the environment error of ``command`` (or of the top level), if any."""
    for key in ("", command):
        if key in errors:
            raise errors[key]


# ---------------------------------------------------------------- job options


def _kv(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), _scalar(value.strip())


def _scalar(value: str) -> Any:
    low = value.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def add_job_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("job (flags override the --config file)")
    g.add_argument("--config", "-c", metavar="JOB.toml", help="job file (TOML); see README")
    g.add_argument("--workers", "-n", type=int, help="number of workers n (default 4)")
    g.add_argument("--rounds", "-r", type=int, help="number of rounds (default 100)")
    g.add_argument("--seed", type=int, help="seed of every random choice (default 0)")
    g.add_argument(
        "--partitions",
        "-k",
        type=int,
        help="number of data partitions k (default: the policy's choice, k = n)",
    )
    g.add_argument(
        "--target-loss", type=float, help="stop once the training objective is at or below this"
    )
    g.add_argument("--eval-every", type=int, help="evaluate loss/metric every N rounds (default 1)")
    g.add_argument(
        "--round-timeout",
        type=float,
        help="seconds a round may wait before the job fails (default 300; while it waits "
        "for a lost worker's replacement, --replace-timeout applies instead)",
    )
    g.add_argument(
        "--replace-timeout",
        type=float,
        help="seconds a round that lost a worker it cannot do without waits for a new "
        "worker to connect and take its place, even past --round-timeout (default 0: the "
        "job fails at once)",
    )
    g.add_argument(
        "--spares",
        type=int,
        help="idle workers standing by to take a lost worker's place at once: `run` starts "
        "this many beyond n and `simulate` models them; needs --replace-timeout > 0 "
        "(default 0; a coordinator you start yourself uses whatever idle workers are "
        "connected)",
    )
    g.add_argument(
        "--policy", "-p", help="aggregation policy (default uncoded; see `codedgd policies`)"
    )
    g.add_argument(
        "--param",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="policy parameter, repeatable (e.g. --param s=1)",
    )
    g.add_argument(
        "--data",
        "-d",
        help="dataset: synthetic (default), lag-synthetic, amazon, covtype, kc-house",
    )
    g.add_argument(
        "--data-opt",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="dataset option, repeatable (synthetic: rows, dim, task, density, noise, "
        "test_fraction; lag-synthetic: workers, dim, growth, noise; real: test_fraction)",
    )
    g.add_argument("--model", "-m", help="model: logistic (default) or least-squares")
    g.add_argument(
        "--l2",
        type=float,
        help="L2 regularization λ (default 1e-4 with the default logistic model; 0 when "
        "--model or the job file's [model] names a model without l2)",
    )
    g.add_argument("--lr", help='step size, a number or "auto" = 1/L (default auto)')
    g.add_argument(
        "--schedule", help="step-size schedule: constant, inverse-sqrt, inverse-time, step"
    )
    g.add_argument(
        "--nesterov",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Nesterov acceleration on or off (default: the job file's, else off)",
    )
    g.add_argument(
        "--stragglers",
        help="straggler model: none (default), exponential, shifted-exponential, pareto, "
        "fixed, slowdown, fail-stop, crash, trace (options: `codedgd stragglers`)",
    )
    g.add_argument(
        "--straggler-opt",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="straggler model option, repeatable (e.g. --straggler-opt mean=0.05)",
    )


def job_from_args(args: argparse.Namespace) -> JobConfig:
    if args.partitions is not None and args.partitions < 1:
        raise ConfigError(
            f"--partitions {args.partitions}: k must be at least 1 (leave the flag out for "
            "the policy's default, k = n)"
        )
    base = JobConfig.from_toml(args.config) if args.config else JobConfig()
    changes: dict[str, Any] = {}
    for flag, key in (
        ("workers", "workers"),
        ("rounds", "rounds"),
        ("seed", "seed"),
        ("partitions", "partitions"),
        ("target_loss", "target_loss"),
        ("eval_every", "eval_every"),
        ("round_timeout", "round_timeout"),
        ("replace_timeout", "replace_timeout"),
        ("spares", "spares"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[key] = value
    changes["policy"] = _merge(base.policy, args.policy, args.param)
    changes["data"] = _merge(base.data, args.data, args.data_opt)
    model_opts = [("l2", args.l2)] if args.l2 is not None else []
    changes["model"] = _merge(base.model, args.model, model_opts)
    changes["stragglers"] = _merge(base.stragglers, args.stragglers, args.straggler_opt)
    optimizer = dict(base.optimizer)
    if args.lr is not None:
        optimizer["lr"] = args.lr if args.lr == "auto" else _scalar(args.lr)
    if args.schedule is not None:
        optimizer["schedule"] = args.schedule
    if args.nesterov is not None:
        optimizer["nesterov"] = args.nesterov
    changes["optimizer"] = optimizer
    return base.replace(**changes)


def _merge(base: Component, name: str | None, options: Sequence[tuple[str, Any]]) -> Component:
    if name is not None and name != base.name:
        merged: dict[str, Any] = {}  # a different component: the file's options do not apply
    else:
        merged = dict(base.options)
    merged.update(dict(options))
    return Component(name or base.name, merged)


def add_security_arguments(p: argparse.ArgumentParser, *, server: bool) -> None:
    g = p.add_argument_group("security")
    g.add_argument("--token", help="shared secret (default: $CODEDGD_TOKEN); prefer --token-file")
    g.add_argument("--token-file", help="read the shared secret from this file")
    if server:
        g.add_argument("--tls-cert", help="serve TLS with this certificate (PEM)")
        g.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
        g.add_argument("--tls-ca", help="require client certificates signed by this CA (mTLS)")
    else:
        g.add_argument("--tls-ca", help="verify the coordinator's TLS certificate with this CA")
        g.add_argument("--tls-cert", help="client certificate for mutual TLS (PEM)")
        g.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
        g.add_argument("--tls-server-name", help="name to verify in the coordinator's certificate")


def _security(args: argparse.Namespace) -> Any:
    from codedgd.services.security import Security

    return Security.from_options(
        token=args.token,
        token_file=args.token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        tls_server_name=getattr(args, "tls_server_name", None),
    )


# ---------------------------------------------------------------- commands


def cmd_run(args: argparse.Namespace) -> int:
    from codedgd.client.local import LocalRun, run_local
    from codedgd.client.progress import Progress

    config = job_from_args(args)
    out = Path(args.output) if args.output else _default_output(config)
    check_output(out)  # before training, not after it
    progress = Progress(config.rounds, enabled=not args.no_progress)
    records: list[RoundRecord] = []  # kept as they come: a failed job's rounds are saved too
    outcome_log = logging.getLogger("codedgd.coordinator.outcome")
    outcome_level = outcome_log.level
    if not args.verbose:  # the error below says how the job ended; once is enough
        outcome_log.setLevel(logging.CRITICAL)

    def on_record(record: RoundRecord) -> None:
        records.append(record)
        progress.update(record)

    job_ids: list[str] = []
    terminated = False

    async def main() -> LocalRun:
        # SIGTERM (a container stopped, `kill`) ends the job as Ctrl-C does: the workers
        # stop, and the rounds done are saved.
        task = asyncio.current_task()
        assert task is not None

        def on_sigterm() -> None:
            nonlocal terminated
            terminated = True
            task.cancel()

        with contextlib.suppress(NotImplementedError, RuntimeError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, on_sigterm)
        return await run_local(
            config,
            data_dir=args.data_dir,
            on_record=on_record,
            on_status=progress.status,
            on_submitted=job_ids.append,
            metrics_port=args.metrics_port,
            worker_log=args.worker_log,
        )

    started = time.time()
    try:
        try:
            result = asyncio.run(main())
        except asyncio.CancelledError:
            if not terminated:
                raise
            raise Terminated from None
    except (JobFailed, KeyboardInterrupt) as exc:
        progress.close()
        if not records:
            raise
        job_doc = {**config.to_dict(), "job_id": job_ids[0] if job_ids else ""}
        return save_unfinished("run", exc, out, job_doc, records, config, started)
    finally:
        progress.close()
        outcome_log.setLevel(outcome_level)
    summary = summarize(result.records, time.time() - started, config)
    json_path, csv_path = write_result_pair(
        out, {**config.to_dict(), "job_id": result.job_id}, result.records, summary
    )
    print(_summary_line(summary))
    print(f"results: {json_path} and {csv_path}")
    return 0


class Terminated(KeyboardInterrupt):
    """The command got SIGTERM: it stops as on Ctrl-C, with its own exit code."""

    exit_code = 128 + signal.SIGTERM


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within: SIGTERM raises :class:`Terminated` (synchronous commands; main thread only)."""

    def handler(signum: int, frame: object) -> None:
        raise Terminated

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def result_paths(out: Path) -> tuple[Path, Path]:
    """The JSON and CSV result files that ``--output`` names (either suffix names both)."""
    json_path = out.with_suffix(".json") if out.suffix.lower() == ".csv" else out
    return json_path, json_path.with_suffix(".csv")


def write_result_pair(
    out: Path,
    job_doc: Mapping[str, Any],
    records: Sequence[RoundRecord],
    summary: Mapping[str, Any],
) -> tuple[Path, Path]:
    """Write the JSON (job, summary, rounds) and the CSV (rounds) of ``--output``."""
    json_path, csv_path = result_paths(out)
    write_results(json_path, job_doc, records, summary)
    write_results(csv_path, {}, records, {})
    return json_path, csv_path


def check_output(out: Path) -> None:
    """Refuse, before anything runs, result files that could not be written at the end.

    Each file is opened for appending (created and removed again if it was not there):
    the one test that answers for permissions, read-only file systems, a directory in
    the way or a file where a directory should be.
    """
    for path in result_paths(out):
        try:
            if path.is_dir():
                raise IsADirectoryError(21, "it is a directory")
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            with path.open("a"):
                pass
            if not existed:
                path.unlink()
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(
                f"cannot write the results to {path}: {reason}; choose another --output"
            ) from None


def save_unfinished(
    command: str,
    exc: BaseException,
    out: Path,
    job_doc: Mapping[str, Any],
    records: Sequence[RoundRecord],
    config: JobConfig,
    started: float,
) -> int:
    """Write the rounds of a job that failed or was interrupted, say where; the exit code."""
    if isinstance(exc, Terminated):
        error, code = "terminated (SIGTERM)", Terminated.exit_code
    elif isinstance(exc, KeyboardInterrupt):
        error, code = "interrupted", 130
    else:
        error, code = str(exc), 2
    summary = {**summarize(records, time.time() - started, config), "error": error}
    json_path, csv_path = write_result_pair(out, job_doc, records, summary)
    print(f"codedgd {command}: error: {error}", file=sys.stderr)
    print(f"the {len(records)} rounds done: {json_path} and {csv_path}", file=sys.stderr)
    return code


def summarize(
    records: Sequence[RoundRecord], elapsed: float, config: JobConfig | None
) -> dict[str, Any]:
    """The summary of a result file (``config`` None: a watched job's, policy unknown)."""
    losses = [r for r in records if not math.isnan(r.loss)]
    last = losses[-1] if losses else None
    times = sorted(r.round_seconds for r in records)
    target_loss = config.target_loss if config is not None else None
    target_round = None
    if target_loss is not None:
        hit = [r for r in losses if r.loss <= target_loss]
        target_round = hit[0] if hit else None
    return {
        "rounds": len(records),
        "policy": config.policy.name if config is not None else None,
        "final_loss": last.loss if last else None,
        "final_metric": last.metric if last else None,
        "metric_name": last.metric_name if last else None,
        "training_seconds": records[-1].wall_seconds if records else 0.0,
        "elapsed_seconds": elapsed,
        "mean_round_seconds": sum(times) / len(times) if times else None,
        "p50_round_seconds": times[len(times) // 2] if times else None,
        "bytes_up": sum(r.bytes_up for r in records),
        "bytes_down": sum(r.bytes_down for r in records),
        "target_loss": target_loss,
        "time_to_target_seconds": target_round.wall_seconds if target_round else None,
        "rounds_to_target": target_round.round + 1 if target_round else None,
    }


def _summary_line(s: dict[str, Any]) -> str:
    parts = [
        f"{s['rounds']} rounds of {s['policy']} in {s['training_seconds']:.2f} s training time"
    ]
    if s["final_loss"] is not None:
        parts.append(f"loss {s['final_loss']:.6g}")
    if s["final_metric"] is not None and not math.isnan(s["final_metric"]):
        parts.append(f"{s['metric_name']} {s['final_metric']:.4g}")
    if s["mean_round_seconds"] is not None:
        parts.append(f"mean round {s['mean_round_seconds'] * 1e3:.1f} ms")
    if s["target_loss"] is not None:
        t = s["time_to_target_seconds"]
        parts.append(
            f"target {s['target_loss']:g} "
            + (f"reached at {t:.2f} s" if t is not None else "not reached")
        )
    return ", ".join(parts)


def _default_output(config: JobConfig) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return (
        Path("results") / f"{config.policy.name}-n{config.workers}-seed{config.seed}-{stamp}.json"
    )


def cmd_coordinator(args: argparse.Namespace) -> int:
    from codedgd.services.address import UNIX_PREFIXES, parse_address
    from codedgd.services.coordinator.server import CoordinatorServer, serve_forever

    security = _security(args)
    # A malformed --listen is refused before the warning below speaks of it.
    host = "" if args.listen.startswith(UNIX_PREFIXES) else parse_address(args.listen)[0]
    if security.token is None and host not in ("", "127.0.0.1", "localhost", "::1"):
        logging.getLogger("codedgd").warning(
            "serving on %s without a token: anyone who reaches this port can join or submit "
            "jobs. Set --token-file (and TLS) outside a private network.",
            args.listen,
        )
    job = job_from_args(args) if (args.config or args.run_default_job) else None

    async def main() -> None:
        server = await CoordinatorServer.start(
            args.listen,
            security=security,
            metrics_port=args.metrics_port,
            data_dir=args.data_dir,
            assign_timeout=args.assign_timeout,
        )
        print(
            f"coordinator listening on {args.listen} (port {server.port})"
            + (f", metrics on :{server.metrics_port}/metrics" if server.metrics_port else ""),
            flush=True,
        )
        if job is not None:
            try:
                run = server.service.submit(job)
            except CodedGDError:
                await server.stop()  # a bad job: nothing stays half-started
                raise
            print(f"submitted job {run.id}", flush=True)
        await serve_forever(server)

    asyncio.run(main())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from codedgd.services.worker.agent import WorkerAgent, WorkerOptions

    options = WorkerOptions(
        coordinator=args.coordinator,
        security=_security(args),
        data_dir=Path(args.data_dir) if args.data_dir else None,
        reconnect=not args.no_reconnect,
    )
    if args.name:
        options.name = args.name

    async def main() -> None:
        agent = WorkerAgent(options)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, agent.stop)
        if args.metrics_port is not None:
            from codedgd.services.worker.metrics import serve_worker_metrics

            serve_worker_metrics(agent, args.metrics_port)
        await agent.run()

    asyncio.run(main())
    return 0


def _client(args: argparse.Namespace) -> Any:
    from codedgd.client.api import Client

    return Client(args.coordinator, _security(args))


def cmd_submit(args: argparse.Namespace) -> int:
    config = job_from_args(args)
    output = Path(args.output) if args.output else None
    if output is not None:
        check_output(output)

    async def main() -> int:
        async with _client(args) as client:
            job_id = await client.submit(config)
            print(job_id, flush=True)
            if args.watch or output:
                return await _watch(
                    client, job_id, config.rounds, output, config, progress=not args.no_progress
                )
        return 0

    return asyncio.run(main())


def cmd_watch(args: argparse.Namespace) -> int:
    output = Path(args.output) if args.output else None
    if output is not None:
        check_output(output)

    async def main() -> int:
        async with _client(args) as client:
            status = await client.status(args.job_id)
            rounds = status.jobs[0].rounds if status.jobs else 0
            return await _watch(
                client, args.job_id, rounds, output, None, progress=not args.no_progress
            )

    return asyncio.run(main())


async def _watch(
    client: Any,
    job_id: str,
    rounds: int,
    output: Path | None,
    config: JobConfig | None,
    *,
    progress: bool,
) -> int:
    """Follow a job's rounds; with ``output``, write them (and how the job ended) there."""
    from codedgd.client.progress import Progress

    bar = Progress(rounds, enabled=progress)
    records: list[RoundRecord] = []
    started = time.time()
    error: str | None = None
    try:
        async for record in client.watch(job_id):
            records.append(record)
            bar.update(record)
    except JobFailed as exc:
        error = str(exc)
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        error = "interrupted (only the watch stopped: the job runs on)"
        raise
    finally:
        bar.close()
        if output is not None:
            summary = summarize(records, time.time() - started, config)
            if error is not None:
                summary["error"] = error
            job_doc = config.to_dict() if config else {}
            json_path, csv_path = write_result_pair(
                output, {**job_doc, "job_id": job_id}, records, summary
            )
            print(f"results: {json_path} and {csv_path}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with _client(args) as client:
            st = await client.status(args.job_id or "")
        print(f"workers connected: {st.workers_connected}")
        for name in st.workers:
            print(f"  {name}")
        for j in st.jobs:
            line = f"job {j.job_id}: {j.state}, {j.rounds_done}/{j.rounds} rounds done"
            if j.state == "assigning":
                line += f" (waiting for idle workers; {st.workers_connected} connected)"
            if not math.isnan(j.loss):
                line += f", loss {j.loss:.6g}"
            if j.error:
                line += f", error: {j.error}"
            print(line)
        return 0

    return asyncio.run(main())


def cmd_cancel(args: argparse.Namespace) -> int:
    async def main() -> int:
        async with _client(args) as client:
            ok = await client.cancel(args.job_id)
        print("cancelled" if ok else "the job had already finished")
        return 0

    return asyncio.run(main())


def cmd_policies(args: argparse.Namespace) -> int:
    from codedgd.services.policies import names, policy_class

    for name in names():
        cls = policy_class(name)
        print(f"{name}  ({'exact' if cls.exact else 'approximate'})")
        print(f"    {cls.summary}")
        for p in cls.parameters:
            print(f"    --param {p.name}=<{p.type.__name__}>  {p.help} (default {p.default!r})")
    return 0


def cmd_stragglers(args: argparse.Namespace) -> int:
    from codedgd.services.stragglers import STRAGGLER_MODELS

    for name, info in STRAGGLER_MODELS.items():
        print(name)
        print(f"    {info.description}")
        for p in info.parameters:
            default = "required" if p.required else f"default {p.default!r}"
            print(f"    --straggler-opt {p.name}=<{p.type.__name__}>  {p.help} ({default})")
    return 0


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="codedgd",
        description="Straggler-resilient, communication-efficient distributed gradient descent.",
        epilog=EPILOG,
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser(
        "run",
        help="run one job with a coordinator and N local worker processes",
        description="Start a coordinator and N worker processes on this machine, "
        "train, show progress, and write per-round results (JSON and CSV).",
        epilog=EPILOG,
    )
    add_job_arguments(p)
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument(
        "--output",
        "-o",
        help="result file (.json; a .csv is written beside it), also written with the "
        "rounds done when the job fails or is interrupted; "
        "default results/<policy>-n<N>-seed<S>-<time>.json",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve the coordinator's Prometheus metrics on 127.0.0.1 at this port",
    )
    p.add_argument("--worker-log", help="append the workers' logs to this file")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "coordinator",
        help="serve a coordinator",
        description="Serve the coordinator: workers dial in, clients submit jobs.",
        epilog=EPILOG,
    )
    p.add_argument(
        "--listen", default="0.0.0.0:50051", help="address to serve gRPC on (default 0.0.0.0:50051)"
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument("--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)")
    p.add_argument(
        "--assign-timeout",
        type=float,
        default=120.0,
        help="seconds a job waits for enough workers (default 120)",
    )
    p.add_argument(
        "--run-default-job",
        action="store_true",
        help="submit the job given by the job flags at start (also with --config)",
    )
    add_job_arguments(p)
    add_security_arguments(p, server=True)
    p.set_defaults(func=cmd_coordinator)

    p = sub.add_parser(
        "worker",
        help="serve as a worker",
        epilog=EPILOG,
        description="Dial a coordinator and compute the rounds it assigns; "
        "reconnects with backoff until the coordinator says Shutdown.",
    )
    p.add_argument(
        "--coordinator", default=DEFAULT_ADDRESS, help=f"host:port (default {DEFAULT_ADDRESS})"
    )
    p.add_argument("--name", help="worker name shown by the coordinator (default host:pid)")
    p.add_argument(
        "--data-dir", help="directory of the real datasets, when jobs load data on workers"
    )
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument(
        "--no-reconnect",
        action="store_true",
        help="exit when the stream ends (a stream that fails before the coordinator "
        "answers is tried up to 3 times)",
    )
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_worker)

    for name, func, helptext in (("submit", cmd_submit, "submit a job to a running coordinator"),):
        p = sub.add_parser(name, help=helptext, description=helptext, epilog=EPILOG)
        p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
        add_job_arguments(p)
        p.add_argument("--watch", "-w", action="store_true", help="follow the job's rounds")
        p.add_argument(
            "--output",
            "-o",
            help="follow the job and write its rounds to this result file (.json; a .csv "
            "is written beside it)",
        )
        p.add_argument("--no-progress", action="store_true", help="no progress bar while following")
        add_security_arguments(p, server=False)
        p.set_defaults(func=func)

    p = sub.add_parser(
        "watch",
        help="follow a job's rounds",
        description="Follow a job's rounds on a running coordinator, from its first "
        "round (those done are sent at once) until the job ends. Ctrl-C stops watching, "
        "not the job.",
        epilog=EPILOG,
    )
    p.add_argument("job_id")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    p.add_argument(
        "--output",
        "-o",
        help="write the rounds to this result file (.json; a .csv is written beside it)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser(
        "status",
        help="jobs and workers of a coordinator",
        description="The workers connected to a coordinator and its jobs (or one job): "
        "state, rounds done, last loss, error.",
        epilog=EPILOG,
    )
    p.add_argument("job_id", nargs="?")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "cancel",
        help="cancel a job",
        description="Cancel a queued or running job. Its watchers get the rounds done "
        "and the error 'cancelled by a client'.",
        epilog=EPILOG,
    )
    p.add_argument("job_id")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser(
        "policies", help="list the aggregation policies and their parameters", epilog=EPILOG
    )
    p.set_defaults(func=cmd_policies)
    p = sub.add_parser(
        "stragglers",
        help="list the straggler models (--stragglers) and their options",
        epilog=EPILOG,
    )
    p.set_defaults(func=cmd_stragglers)

    # Commands that live in their own modules.
    from codedgd.client.health import add_parser as add_health_parser
    from codedgd.client.sim_cli import add_report_parser, add_simulate_parser

    add_simulate_parser(sub)
    add_report_parser(sub)
    add_health_parser(sub)
    for command in sub.choices.values():  # -v after the command too: `codedgd run -v`
        command.add_argument(
            "-v",
            "--verbose",
            action="count",
            default=argparse.SUPPRESS,
            help="more logging (-vv: debug)",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    env_errors = apply_env_defaults(parser)
    args = parser.parse_args(argv)
    try:
        check_env(env_errors, args.command)
    except ConfigError as exc:
        print(f"codedgd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2)
        if args.command not in ("coordinator", "worker")
        else logging.INFO - 10 * min(args.verbose, 1),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if args.command in ("run", "coordinator", "worker"):
        from codedgd.services.allocator import keep_freed_memory

        keep_freed_memory()
    try:
        return int(args.func(args))
    except CodedGDError as exc:
        print(f"codedgd {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"codedgd {args.command}: terminated (SIGTERM)", file=sys.stderr)
        return Terminated.exit_code
    except KeyboardInterrupt:
        print(f"codedgd {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        print(f"codedgd {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ConfigError",
    "apply_env_defaults",
    "build_parser",
    "check_env",
    "job_from_args",
    "main",
]
