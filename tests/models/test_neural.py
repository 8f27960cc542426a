"""Neural networks as gradient oracles (PyTorch, the codedgd[torch] extra): θ is the
network's parameters in a fixed order; a worker's gradient sum over its rows equals
autograd's on the same rows; coded rounds decode the full gradient exactly; bad labels,
a missing step size and a missing torch are refused naming the fix; the trained network
comes out as a state_dict PyTorch loads."""

from __future__ import annotations

import builtins
import itertools
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from codedgd.services.compute.gradient import Computer, PartitionRows
from codedgd.services.errors import ConfigError, DataError
from codedgd.services.models import create_model, initial_theta, parameter_count
from codedgd.services.models.neural import NeuralNetwork, export_network
from codedgd.services.models.saved import SavedModel
from tests.conftest import require_torch
from tests.policies.support import planned, relative_error, run_round

torch: Any = require_torch()


def _images(rows: int, seed: int = 0, side: int = 16) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.random((rows, side * side)), rng.integers(0, 10, rows).astype(np.float64)


def _autograd_sum(net: Any, theta: np.ndarray, X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Σ_i ∇ℓ_i by torch alone: the reference the worker's oracle must match."""
    params = list(net.parameters())
    vector = torch.tensor(theta, dtype=params[0].dtype)
    torch.nn.utils.vector_to_parameters(vector, params)
    out = net(torch.tensor(X, dtype=params[0].dtype))
    loss = torch.nn.functional.cross_entropy(
        out, torch.tensor(y, dtype=torch.long), reduction="sum"
    )
    grads = torch.autograd.grad(loss, params)
    return torch.cat([g.reshape(-1) for g in grads]).double().numpy()


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_the_gradient_sum_is_autograds_and_theta_is_the_parameters_in_order(name: str) -> None:
    model = create_model(name, {"dtype": "float64", "hidden": 16})
    X, y = _images(20)
    theta0 = initial_theta(model, X.shape[1], seed=3)
    assert theta0.shape == (parameter_count(model, X.shape[1]),)
    assert np.array_equal(theta0, initial_theta(model, X.shape[1], seed=3))  # seeded
    assert not np.array_equal(theta0, initial_theta(model, X.shape[1], seed=4))
    reference = NeuralNetwork(name, {"dtype": "float64", "hidden": 16})._build(X.shape[1], 9)
    got = model.grad_sum(theta0, X, y)
    assert np.allclose(got, _autograd_sum(reference, theta0, X, y), rtol=1e-12, atol=1e-12)
    rows = np.array([1, 4, 7])
    block = model.block(X, y)
    assert np.allclose(block.grad_sum_rows(theta0, rows), model.grad_sum(theta0, X[rows], y[rows]))


def test_a_coded_round_decodes_the_networks_full_gradient_for_every_straggler_set() -> None:
    n, s = 5, 2
    policy, plan = planned("cyclic", n, {"s": s})
    model = create_model("mlp", {"dtype": "float64", "hidden": 8})
    X, y = _images(50, seed=1)
    blocks = np.array_split(np.arange(50), n)
    parts = [PartitionRows(p, X[b], y[b]) for p, b in enumerate(blocks)]
    theta = initial_theta(model, X.shape[1], seed=0)
    target = model.grad_sum(theta, X, y)  # single-process, full batch
    computers = [
        Computer(model, [parts[p] for p in wp.partitions], wp.coefficients) for wp in plan.workers
    ]
    msgs = [c.compute(theta).payload for c in computers]
    for t, stragglers in enumerate(itertools.combinations(range(n), s)):
        order = [w for w in range(n) if w not in stragglers]
        est = run_round(policy, msgs, order, theta.shape[0], t)
        assert est.exact and relative_error(est.gradient, target) <= 1e-10, stragglers


def test_gradients_computed_at_once_in_two_threads_do_not_mix() -> None:
    """A worker's cancelled round finishes its partition in its thread while the next
    round starts in another, on the same model object: each must get its own θ's
    gradient (a shared network whose parameters each loaded once did not: under load a
    coded run on Fashion-MNIST took a mixed step and its loss jumped from 0.7 to 8.6)."""
    ROUNDS = 200  # the old shared network went wrong in about 1 of 80 such pairs
    model = create_model("mlp", {"dtype": "float64", "hidden": 32})
    X, y = _images(400, seed=2)
    block = model.block(X, y)
    thetas = [initial_theta(model, X.shape[1], seed=k) for k in (0, 1)]
    expected = [block.grad_sum(theta) for theta in thetas]
    start = threading.Barrier(2)
    wrong: list[int] = []

    def compute(k: int) -> None:
        start.wait()
        for _ in range(ROUNDS):
            try:
                if not np.array_equal(block.grad_sum(thetas[k]), expected[k]):
                    wrong.append(k)
            except Exception:  # e.g. a .grad the other thread had just cleared
                wrong.append(k)

    threads = [threading.Thread(target=compute, args=(k,)) for k in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong, f"{len(wrong)} of {2 * ROUNDS} gradients mixed the other thread's θ"


def test_labels_beyond_the_output_layer_are_refused_naming_the_option() -> None:
    model = create_model("mlp", {"classes": 3})
    X, y = _images(6)
    with pytest.raises(DataError, match="classes=N"):
        model.block(X, y)
    with pytest.raises(ConfigError, match="no option"):
        create_model("mlp", {"layers": 3})
    with pytest.raises(ConfigError, match="square images"):
        parameter_count(create_model("cnn"), 10)


def test_a_network_needs_a_step_size_and_says_so() -> None:
    with pytest.raises(ConfigError, match="--lr"):
        create_model("mlp").smoothness(np.zeros((1, 1)))


def test_without_torch_a_network_is_refused_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_import = builtins.__import__

    def no_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "torch" or name.startswith("torch."):
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ConfigError, match=r"codedgd\[torch\]"):
        create_model("cnn")


def test_the_trained_network_loads_into_pytorch_and_predicts_the_same(tmp_path: Path) -> None:
    model = create_model("cnn", {"dtype": "float64"})
    X, _ = _images(8, side=28)
    theta = initial_theta(model, 784, seed=5) + 0.01
    saved = SavedModel(theta, {"name": "cnn", "options": {"dtype": "float64"}}, "multiclass",
                       {"name": "fashion-mnist"}, rounds=1, features=784)  # fmt: skip
    path = export_network(tmp_path / "net.pt", saved)
    assert path is not None
    net = NeuralNetwork("cnn", {"dtype": "float64"})._build(784, 0)
    net.load_state_dict(torch.load(path, weights_only=True))
    with torch.no_grad():
        theirs = net(torch.tensor(X)).argmax(dim=1).numpy()
    assert np.array_equal(theirs, model.predict(theta, X))
    # A linear model writes no state_dict.
    linear = SavedModel(np.zeros(3), {"name": "logistic", "options": {}}, "classification", {}, 1)
    assert export_network(tmp_path / "lin.pt", linear) is None
