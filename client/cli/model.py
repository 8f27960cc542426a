"""`codedgd model`, `evaluate` and `predict`: a trained model out of a job, and used.

A job's model is θ after its last completed round with what it means (model, features,
dataset, job), in one ``.npz`` file (codedgd.services.models.saved). ``run``,
``simulate`` and ``submit``/``watch`` with ``--output`` write it beside their results
(``x.json`` → ``x.model.npz``); ``model`` fetches it from a coordinator; ``evaluate``
scores it on a dataset; ``predict`` writes its predictions; ``--init-from`` starts a
job from it.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import math
from pathlib import Path
from typing import Any

from codedgd.client.cli.options import (
    DEFAULT_ADDRESS,
    EPILOG,
    _kv,
    add_security_arguments,
    security_from_args,
)
from codedgd.services.errors import ConfigError


def add_parsers(sub: Any) -> None:
    p = sub.add_parser(
        "model",
        help="fetch a job's trained model from a coordinator into a file",
        description="Fetch θ of a job (after its last completed round) with its description "
        "from a running coordinator, checksum checked, into a model file (.npz).",
        epilog=EPILOG,
    )
    p.add_argument("job_id")
    p.add_argument("--output", "-o", required=True, help="the model file to write (.npz)")
    p.add_argument("--coordinator", default=DEFAULT_ADDRESS, help="host:port")
    add_security_arguments(p, server=False)
    p.set_defaults(func=cmd_model)

    for name, helptext, func in (
        ("evaluate", "score a trained model on a dataset: training loss and held-out metric",
         cmd_evaluate),
        ("predict", "write a trained model's predictions for a dataset's rows (CSV)",
         cmd_predict),
    ):  # fmt: skip
        p = sub.add_parser(name, help=helptext, description=helptext, epilog=EPILOG)
        p.add_argument("model", metavar="MODEL.npz", help="a model file")
        p.add_argument(
            "--data",
            "-d",
            help="dataset (default: the one the model was trained on, same options and seed)",
        )
        p.add_argument(
            "--data-opt",
            action="append",
            type=_kv,
            default=[],
            metavar="KEY=VALUE",
            help="dataset option, repeatable (replaces the model's dataset options)",
        )
        p.add_argument("--seed", type=int, help="the dataset's seed (default: the model's)")
        p.add_argument(
            "--data-dir", help="directory of the real datasets (default $CODEDGD_DATA_DIR)"
        )
        if name == "predict":
            p.add_argument("--output", "-o", required=True, help="the CSV to write")
            p.add_argument(
                "--rows",
                choices=["test", "train", "all"],
                default="test",
                help="which rows of the dataset's split (default test)",
            )
        p.set_defaults(func=func)


def cmd_model(args: argparse.Namespace) -> int:
    from codedgd.client.api import Client
    from codedgd.services.models.saved import save_model

    async def main() -> int:
        async with Client(args.coordinator, security_from_args(args)) as client:
            saved = await client.model(args.job_id)
        path = save_model(args.output, saved)
        print(f"model of job {args.job_id}: {path} ({saved.dim} parameters, {saved.rounds} rounds)")
        return 0

    return asyncio.run(main())


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The model file, its model and the dataset to score it on."""
    from codedgd.services.data import load_dataset
    from codedgd.services.models import create_model
    from codedgd.services.models.saved import load_model

    saved = load_model(args.model)
    model = create_model(saved.model["name"], saved.model.get("options", {}))
    name = args.data or saved.dataset["name"]
    if args.data_opt:
        options = dict(args.data_opt)
    else:
        options = dict(saved.dataset.get("options", {})) if name == saved.dataset["name"] else {}
    seed = args.seed if args.seed is not None else int(saved.dataset.get("seed", 0))
    dataset = load_dataset(name, options, seed=seed, data_dir=args.data_dir)
    if dataset.dim != saved.dim:
        raise ConfigError(
            f"the model has {saved.dim} parameters but dataset {name!r} has {dataset.dim} "
            "features: score it on data with the features it was trained on"
        )
    return saved, model, dataset


def cmd_evaluate(args: argparse.Namespace) -> int:
    from codedgd.services.models import objective

    saved, model, ds = _load(args)
    loss = objective(model, saved.theta, ds.X_train, ds.y_train)
    metric = model.metric(saved.theta, ds.X_test, ds.y_test) if ds.y_test.size else math.nan
    print(
        f"{saved.model['name']} ({saved.dim} parameters, {saved.rounds} rounds) on "
        f"{ds.name}: training loss {loss:.6g} ({ds.n_train} rows), held-out "
        f"{model.metric_name} {metric:.4g} ({ds.y_test.size} rows)"
    )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from codedgd.client.results import check_output

    out = Path(args.output)
    saved, model, ds = _load(args)
    check_output(out.with_suffix(".json"))  # the same checks a result file gets
    parts = {"train": [(ds.X_train, ds.y_train)], "test": [(ds.X_test, ds.y_test)]}
    parts["all"] = parts["train"] + parts["test"]
    rows = 0
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "label", "prediction"])
        for X, y in parts[args.rows]:
            predictions = model.predict(saved.theta, X)
            for i, (label, value) in enumerate(zip(y, predictions, strict=True)):
                writer.writerow([rows + i, repr(float(label)), repr(float(value))])
            rows += int(X.shape[0])
    what = "P(y = 1)" if saved.task == "classification" else "the predicted value"
    print(f"{rows} predictions ({what}) of the {args.rows} rows of {ds.name}: {out}")
    return 0
