"""Neural networks as gradient oracles, through PyTorch (the ``codedgd[torch]`` extra).

θ is a network's parameters flattened into one float64 vector, in the order of
``module.parameters()`` (:func:`torch.nn.utils.parameters_to_vector`), so encoding,
decoding and the optimizer see a vector like any other model's. A worker runs the network
on views of θ (:func:`torch.func.functional_call`, on a copy of the module per thread, so
a cancelled round's computation still in its thread cannot mix its θ or gradient with the
next round's), backpropagates the summed cross-entropy Σ_i ℓ(x_i, y_i; θ) over its rows
into θ's own gradient, in the same order; the coordinator evaluates the loss
and the held-out accuracy the same way, and exports the trained network as a PyTorch
``state_dict`` (:func:`state_dict`).

Two networks, chosen by name like the linear models:

- ``mlp``: features → ``hidden`` (default 128) → ReLU → ``classes`` (default 10);
- ``cnn``: a square image of side √features (28 for Fashion-MNIST), two 5x5 convolutions
  (8 and 16 channels, each with ReLU and 2x2 max-pooling), then a linear layer to
  ``classes``.

Labels are class indices 0..classes−1. The network is built, and its first θ drawn, from
the job's seed (the same θ₀ on every machine); ``dtype`` (``float32`` by default, or
``float64``) is the arithmetic inside the network, whatever θ's float64 on the wire. torch
is imported only when such a model is used: without it, the job is refused naming the
extra to install.
"""

from __future__ import annotations

import math
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from codedgd.services.data.dataset import Matrix
from codedgd.services.errors import ConfigError, DataError
from codedgd.services.files import atomic_open
from codedgd.services.models.base import refuse_unknown_options
from codedgd.services.models.saved import SavedModel

NETWORKS: dict[str, str] = {
    "mlp": "a multilayer perceptron (one hidden layer, ReLU) for class labels 0..classes-1; "
    "metric accuracy; needs codedgd[torch]",
    "cnn": "a small convolutional network for square images (two 5x5 convolutions, max "
    "pooling); metric accuracy; needs codedgd[torch]",
}
OPTIONS: dict[str, str] = {
    "l2": "L2 regularisation λ >= 0 of the objective (default 0)",
    "classes": "output classes (default 10); labels are 0..classes-1",
    "hidden": "mlp: units of the hidden layer (default 128)",
    "dtype": "arithmetic inside the network: float32 (default) or float64",
}
_BUILDING = threading.Lock()
EVAL_ROWS = 4096  # rows per forward pass when evaluating (bounds the activations' memory)


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError(
            "neural-network models (mlp, cnn) need PyTorch: pip install 'codedgd[torch]' "
            "(on a machine without a GPU, first: pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu); in a container, the image built with "
            "--build-arg EXTRAS=torch (docker/Dockerfile)"
        ) from None
    return torch


def _int_option(name: str, options: dict[str, Any], key: str, default: int, low: int) -> int:
    value = options.get(key, default)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"model {name!r}: {key} must be an integer >= {low}, got {value!r}")
    return value


class NeuralNetwork:
    """A torch network behind the :class:`~codedgd.services.models.base.Model` protocol.

    The network is built lazily, once the data's feature count is known
    (:meth:`parameter_count`, or the first gradient), always from ``seed``.
    """

    metric_name: ClassVar[str] = "accuracy"
    higher_is_better: ClassVar[bool] = True

    def __init__(self, name: str, options: dict[str, Any] | None = None) -> None:
        if name not in NETWORKS:
            raise ConfigError(f"unknown network {name!r}; choose from {', '.join(NETWORKS)}")
        opts = dict(options or {})
        refuse_unknown_options(name, opts, OPTIONS)
        self.name = name
        self.classes = _int_option(name, opts, "classes", 10, 2)
        self.hidden = _int_option(name, opts, "hidden", 128, 1)
        dtype = opts.get("dtype", "float32")
        if dtype not in ("float32", "float64"):
            raise ConfigError(f"model {name!r}: dtype must be float32 or float64, got {dtype!r}")
        self.dtype_name = str(dtype)
        l2 = opts.get("l2", 0.0)
        try:
            self.l2 = float(l2)
        except (TypeError, ValueError):
            raise ConfigError(f"model {name!r}: l2 must be a number >= 0, got {l2!r}") from None
        if not (math.isfinite(self.l2) and self.l2 >= 0):
            raise ConfigError(f"model {name!r}: l2 must be a number >= 0, got {l2!r}")
        self.torch = _torch()
        self.seed = 0
        # One copy of the network per thread: functional_call swaps θ's views into the
        # module while it runs, and a cancelled round's computation may still be running
        # in its thread when the next round's starts in another.
        self._threads = threading.local()
        self._generation = 0  # bumped by initial_theta: every thread's copy is rebuilt

    def __repr__(self) -> str:
        return f"NeuralNetwork({self.name!r}, classes={self.classes}, dtype={self.dtype_name})"

    # ------------------------------------------------------------ the network

    @property
    def _dtype(self) -> Any:
        return self.torch.float64 if self.dtype_name == "float64" else self.torch.float32

    def _build(self, features: int, seed: int) -> Any:
        torch = self.torch
        nn = torch.nn
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)  # the same θ₀ on every machine
        try:
            if self.name == "mlp":
                net = nn.Sequential(
                    nn.Linear(features, self.hidden),
                    nn.ReLU(),
                    nn.Linear(self.hidden, self.classes),
                )
            else:
                side = math.isqrt(features)
                if side * side != features or side < 16:
                    raise ConfigError(
                        f"model 'cnn' takes square images of side >= 16, but the data has "
                        f"{features} features (not a square of such a side): use -m mlp"
                    )
                inner = ((side - 4) // 2 - 4) // 2
                net = nn.Sequential(
                    nn.Unflatten(1, (1, side, side)),
                    nn.Conv2d(1, 8, 5),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                    nn.Conv2d(8, 16, 5),
                    nn.ReLU(),
                    nn.MaxPool2d(2),
                    nn.Flatten(),
                    nn.Linear(16 * inner * inner, self.classes),
                )
        finally:
            torch.random.set_rng_state(generator_state)
        return net.to(self._dtype)

    def network(self, features: int) -> Any:
        """The network for data of ``features`` columns (built once, from the seed)."""
        own = self._threads
        if getattr(own, "key", None) != (self._generation, features):
            with _BUILDING:  # torch's seeded generator is global: one build at a time
                own.net = self._build(features, self.seed)
            own.key = (self._generation, features)
        return own.net

    def parameter_count(self, features: int) -> int:
        """θ's length: the network's parameters."""
        return int(sum(p.numel() for p in self.network(features).parameters()))

    def initial_theta(self, features: int, seed: int) -> np.ndarray:
        """θ₀: the network's seeded initial parameters (PyTorch's default init)."""
        self.seed = seed
        self._generation += 1
        return self._flat(self.network(features).parameters())

    def _flat(self, tensors: Any) -> np.ndarray:
        vector = self.torch.nn.utils.parameters_to_vector(list(tensors))
        return np.asarray(vector.detach().to(self.torch.float64).cpu().numpy(), dtype=np.float64)

    def _parameters(self, theta: np.ndarray, features: int, *, grad: bool) -> tuple[Any, Any]:
        """θ as the network's parameters: (the flat tensor, {name: a view of it}).

        The views are handed to :func:`torch.func.functional_call` on this thread's own
        copy of the network: a computation a cancelled round left running in its thread
        and the next round's (or an evaluation) cannot mix each other's θ or gradients.
        """
        net = self.network(features)
        expected = self.parameter_count(features)
        if theta.shape != (expected,):
            raise DataError(
                f"θ has {theta.shape[0] if theta.ndim == 1 else theta.shape} values but model "
                f"{self.name!r} on {features} features has {expected} parameters"
            )
        if not np.all(np.isfinite(theta)):
            raise DataError(f"θ of model {self.name!r} holds NaN or inf")
        flat = self.torch.tensor(theta, dtype=self._dtype)  # a copy: θ may be read-only
        flat.requires_grad_(grad)
        views, offset = {}, 0
        for name, p in net.named_parameters():
            views[name] = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        return flat, views

    def _forward(self, views: Any, features: int, X: Any) -> Any:
        return self.torch.func.functional_call(self.network(features), views, (X,))

    # ------------------------------------------------------------ data

    def _inputs(self, X: Matrix) -> Any:
        dense = X.toarray() if isinstance(X, sp.spmatrix | sp.sparray) else np.asarray(X)
        return self.torch.from_numpy(np.ascontiguousarray(dense)).to(self._dtype)

    def _labels(self, y: np.ndarray) -> Any:
        y = np.asarray(y)
        if y.ndim != 1:
            raise DataError(f"labels must be one per row, got shape {y.shape}")
        if y.size and (
            not np.all(np.isfinite(y))
            or np.any(y != np.round(y))
            or y.min() < 0
            or y.max() >= self.classes
        ):
            bad = y[(y != np.round(y)) | (y < 0) | (y >= self.classes) | ~np.isfinite(y)][0]
            raise DataError(
                f"label {bad!r} does not fit model {self.name!r}, whose output layer has "
                f"{self.classes} classes (labels 0..{self.classes - 1}): set "
                f"--model-opt classes=N to the number of classes in the data"
            )
        return self.torch.from_numpy(y.astype(np.int64))

    # ------------------------------------------------------------ the Model protocol

    def loss_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        torch = self.torch
        features = int(X.shape[1])
        _, views = self._parameters(theta, features, grad=False)
        labels = self._labels(y)
        total = 0.0
        with torch.no_grad():
            for lo in range(0, int(X.shape[0]), EVAL_ROWS):
                out = self._forward(views, features, self._inputs(X[lo : lo + EVAL_ROWS]))
                loss = torch.nn.functional.cross_entropy(
                    out, labels[lo : lo + EVAL_ROWS], reduction="sum"
                )
                total += float(loss)
        return total

    def grad_sum(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> np.ndarray:
        return self.block(X, y).grad_sum(theta)

    def block(self, X: Matrix, y: np.ndarray) -> NetworkBlock:
        if int(X.shape[0]) != int(np.asarray(y).shape[0]):
            raise DataError(f"labels have shape {np.shape(y)} but the data has {X.shape[0]} rows")
        return NetworkBlock(self, self._inputs(X), self._labels(y), int(X.shape[1]))

    def predict(self, theta: np.ndarray, X: Matrix) -> np.ndarray:
        """The predicted class of each row."""
        predicted: np.ndarray = np.argmax(self.scores(theta, X), axis=1).astype(np.float64)
        return predicted

    def scores(self, theta: np.ndarray, X: Matrix) -> np.ndarray:
        """The network's outputs (logits), one row per row of X."""
        torch = self.torch
        features = int(X.shape[1])
        _, views = self._parameters(theta, features, grad=False)
        parts = []
        with torch.no_grad():
            for lo in range(0, int(X.shape[0]), EVAL_ROWS):
                out = self._forward(views, features, self._inputs(X[lo : lo + EVAL_ROWS]))
                parts.append(out.to(torch.float64).numpy())
        return np.concatenate(parts) if parts else np.zeros((0, self.classes))

    def metric(self, theta: np.ndarray, X: Matrix, y: np.ndarray) -> float:
        """Held-out accuracy: the share of rows whose predicted class is the label."""
        if int(X.shape[0]) == 0:
            return math.nan
        self._labels(y)
        return float(np.mean(self.predict(theta, X) == np.asarray(y)))

    def smoothness(self, X: Matrix) -> float:
        raise ConfigError(
            f"model {self.name!r} has no smoothness constant (a network's loss is not "
            "L-smooth with a known L): give the step size (--lr, e.g. 0.05; [optimizer] lr), "
            "and use a policy that does not need one (not the lag family)"
        )

    def module(self, theta: np.ndarray, features: int) -> Any:
        """A new ``torch.nn.Module`` of this network holding θ (the caller's to train or
        save; codedgd never touches it again)."""
        with _BUILDING:
            net = self._build(features, self.seed)
        _, views = self._parameters(theta, features, grad=False)
        with self.torch.no_grad():
            for name, p in net.named_parameters():
                p.copy_(views[name])
        return net

    def state_dict(self, theta: np.ndarray, features: int) -> dict[str, Any]:
        """θ as the network's ``state_dict`` (what ``torch.save`` writes)."""
        return {k: v.detach().clone() for k, v in self.module(theta, features).state_dict().items()}


class NetworkBlock:
    """Σ_i ∇ℓ_i over fixed rows: the rows converted to tensors once, then one backward
    pass per θ (or per sample of the rows: :meth:`grad_sum_rows`)."""

    def __init__(self, model: NeuralNetwork, X: Any, y: Any, features: int) -> None:
        self.model = model
        self.X = X
        self.y = y
        self.features = features

    def grad_sum(self, theta: np.ndarray) -> np.ndarray:
        return self._backward(theta, self.X, self.y)

    def grad_sum_rows(self, theta: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The gradient over the rows ``rows`` of the block only."""
        index = self.model.torch.from_numpy(np.asarray(rows, dtype=np.int64))
        return self._backward(theta, self.X[index], self.y[index])

    def _backward(self, theta: np.ndarray, X: Any, y: Any) -> np.ndarray:
        model = self.model
        torch = model.torch
        flat, views = model._parameters(theta, self.features, grad=True)
        if X.shape[0] == 0:
            return np.zeros(theta.shape[0])
        out = model._forward(views, self.features, X)
        loss = torch.nn.functional.cross_entropy(out, y, reduction="sum")
        (gradient,) = torch.autograd.grad(loss, flat)
        return np.asarray(gradient.to(torch.float64).numpy(), dtype=np.float64)


def export_network(path: Path, saved: SavedModel) -> Path | None:
    """A trained network's ``state_dict``, for PyTorch users, written with ``torch.save``
    (atomically) to ``path``: ``net.load_state_dict(torch.load(path))`` on the network the
    model names (the same layers, in :func:`NeuralNetwork._build`'s order). None, and
    nothing written, for a model that is not a network or a file without its ``features``.
    """
    name = saved.model.get("name")
    if name not in NETWORKS or saved.features is None:
        return None
    options = {k: v for k, v in dict(saved.model.get("options") or {}).items()}
    network = NeuralNetwork(str(name), options)
    state = network.state_dict(saved.theta, saved.features)
    with atomic_open(path, "wb") as fh:
        network.torch.save(state, fh)
    return path
