"""What every `codedgd` command shares: environment defaults, job flags, security flags.

Every long option of every command reads its default from ``CODEDGD_<FLAG_NAME>`` (a flag
on the command line wins); containers and cloud-init configure the services this way.
The job flags (``--workers``, ``--policy``, ...) override a ``--config`` job file.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from codedgd.services.errors import ConfigError
from codedgd.services.job import Component, JobConfig

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


def cores_option(text: str, also: str = "") -> float:
    """--cores: a positive number of cores, or 'local' for the cores this process may run
    on (as a worker counts its machine's: its CPU affinity and cgroup quota). ``also``
    names the other words the option takes, for the error."""
    from codedgd.services.machine import this_machine
    from codedgd.services.sim.cost import MIN_CORES

    if text == "local":
        return float(this_machine().cpus or 1)
    words = f", 'local' or {also}" if also else " or 'local'"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of cores{words}") from None
    if not (value >= MIN_CORES and math.isfinite(value)):
        raise argparse.ArgumentTypeError(
            f"cores must be a finite number >= {MIN_CORES:g}{words}; got {text}"
        )
    return value


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
        "--batch-size",
        type=int,
        metavar="B",
        help="mini-batch rounds: each round uses a seeded sample of B rows of every "
        "partition, the same on every worker that holds it (exact codes stay exact on the "
        "sample), scaled to estimate the full gradient (default 0: every row)",
    )
    g.add_argument(
        "--peer-deadline-factor",
        type=float,
        metavar="F",
        help="ring and tree jobs: a worker reports a peer silent once it has waited for the "
        "peer's data F times the longest of the last 20 rounds (default 10), and the "
        "coordinator throws out the workers at the root of such waits",
    )
    g.add_argument(
        "--peer-deadline-min",
        type=float,
        metavar="SEC",
        help="the shortest such wait, in seconds (default 5: a busy machine or a newcomer's "
        "first round can stall that long without being silent)",
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
        "--init-from",
        metavar="MODEL.npz",
        help="start from the θ of this model file (written beside a run's results) instead "
        "of zeros; the same model and features. Read where the job runs: on the "
        "coordinator's machine for `submit`",
    )
    g.add_argument(
        "--policy", "-p", help="aggregation policy (default uncoded; see `codedgd policies`)"
    )
    g.add_argument(
        "--max-norm-ratio",
        type=float,
        metavar="R",
        help="norm guard: throw out a worker whose result's norm is more than R times the "
        "median of recent results' (per unit of its code's coefficients), e.g. 100 "
        "(default 0: off; needs n >= 3; the robust policies median, trimmed-mean and frc "
        "with byzantine=e outvote corrupt results the guard cannot see)",
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
        help="dataset: synthetic (default), lag-synthetic, amazon, covtype, kc-house, "
        "fashion-mnist (its IDX files; docs/neural.md), file (your own: --data-opt path=..., "
        "docs/data.md), or an installed plugin's",
    )
    g.add_argument(
        "--data-opt",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="dataset option, repeatable (synthetic: rows, dim, task, density, noise, "
        "test_fraction; lag-synthetic: workers, dim, growth, noise; real: test_fraction; "
        "file: path, format, label, task, delimiter, bias, test_fraction)",
    )
    g.add_argument(
        "--model",
        "-m",
        help="model: logistic (default), least-squares, the PyTorch networks mlp and cnn "
        "(pip install 'codedgd[torch]'; give --lr; docs/neural.md), or an installed "
        "plugin's (docs/data.md)",
    )
    g.add_argument(
        "--model-opt",
        action="append",
        type=_kv,
        default=[],
        metavar="KEY=VALUE",
        help="model option, repeatable (logistic, least-squares: l2; a plugin's: its own)",
    )
    g.add_argument(
        "--l2",
        type=float,
        help="L2 regularization λ (default 1e-4 with the default logistic model; 0 when "
        "--model or the job file's [model] names a model without l2)",
    )
    g.add_argument(
        "--lr",
        help='step size: a number, "auto" = 1/L, or F/L, e.g. 0.5/L (default auto)',
    )
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
        ("batch_size", "batch_size"),
        ("peer_deadline_factor", "peer_deadline_factor"),
        ("peer_deadline_min", "peer_deadline_min"),
        ("spares", "spares"),
        ("init_from", "init_from"),
        ("max_norm_ratio", "max_norm_ratio"),
    ):
        value = getattr(args, flag)
        if value is not None:
            changes[key] = value
    changes["policy"] = _merge(base.policy, args.policy, args.param)
    changes["data"] = _merge(base.data, args.data, args.data_opt)
    model_opts = list(args.model_opt) + ([("l2", args.l2)] if args.l2 is not None else [])
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


# ---------------------------------------------------------------- security


def add_security_arguments(p: argparse.ArgumentParser, *, server: bool) -> None:
    """The token and TLS flags (docs/security.md): a coordinator's role tokens, or the one
    token a client or worker sends."""
    g = p.add_argument_group("security (docs/security.md)")
    if server:
        _add_server_tokens(g)
        g.add_argument("--tls-cert", help="serve TLS with this certificate (PEM)")
        g.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
        g.add_argument(
            "--tls-ca",
            help="require client certificates signed by this CA (mTLS); one whose subject "
            "has OU=worker or OU=operator opens that role only",
        )
    else:
        g.add_argument(
            "--token",
            help="the token to send: the coordinator's worker token for `codedgd worker`, "
            "its operator token for the other commands, or its one shared token (default: "
            "$CODEDGD_TOKEN, else $CODEDGD_WORKER_TOKEN for `codedgd worker` and "
            "$CODEDGD_OPERATOR_TOKEN for the others); prefer --token-file",
        )
        g.add_argument("--token-file", help="read that token from this file")
        g.add_argument("--tls-ca", help="verify the coordinator's TLS certificate with this CA")
        g.add_argument("--tls-cert", help="client certificate for mutual TLS (PEM)")
        g.add_argument("--tls-key", help="private key of --tls-cert (PEM)")
        g.add_argument("--tls-server-name", help="name to verify in the coordinator's certificate")


def _role_token_from_env(args: argparse.Namespace) -> str | None:
    """A client's or worker's token when neither --token nor --token-file gives one: the
    variable the coordinator reads its token of this command's role from
    (CODEDGD_WORKER_TOKEN for `codedgd worker`, CODEDGD_OPERATOR_TOKEN for the others), so
    one environment can hold every role's token (as the compose file does)."""
    if hasattr(args, "worker_token") or args.token_file:
        return None  # a coordinator, or a token file given
    role = "worker" if getattr(args, "command", None) == "worker" else "operator"
    return os.environ.get(env_name(f"--{role}-token")) or None


def _add_server_tokens(g: argparse._ArgumentGroup) -> None:
    g.add_argument(
        "--worker-token",
        help="the workers' token: it opens Connect (a worker's stream) and nothing else "
        "(default: $CODEDGD_WORKER_TOKEN); prefer --worker-token-file",
    )
    g.add_argument("--worker-token-file", help="read the workers' token from this file")
    g.add_argument(
        "--operator-token",
        help="the operators' token: it opens submit, watch, status, cancel and model, not "
        "Connect (default: $CODEDGD_OPERATOR_TOKEN); prefer --operator-token-file",
    )
    g.add_argument("--operator-token-file", help="read the operators' token from this file")
    g.add_argument(
        "--token",
        help="single-token mode: one token that opens both roles, workers' and operators' "
        "(default: $CODEDGD_TOKEN); prefer the two role tokens",
    )
    g.add_argument("--token-file", help="read the single-mode token from this file")


def security_from_args(args: argparse.Namespace) -> Any:
    from codedgd.services.security import Security

    return Security.from_options(
        token=args.token or _role_token_from_env(args),
        token_file=args.token_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        tls_ca=args.tls_ca,
        tls_server_name=getattr(args, "tls_server_name", None),
        worker_token=getattr(args, "worker_token", None),
        worker_token_file=getattr(args, "worker_token_file", None),
        operator_token=getattr(args, "operator_token", None),
        operator_token_file=getattr(args, "operator_token_file", None),
    )
