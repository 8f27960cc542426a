"""Lazy aggregation policies: the trigger arithmetic, the aggregate invariant, lagc exactness,
and LAG's own synthetic benchmark (M = 9 heterogeneous least-squares workers)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from codedgd.services.compute.lazy import THRESHOLD_PARAM, LazyUploader
from codedgd.services.data import load_dataset
from codedgd.services.errors import ConfigError, DecodeError, PlanError
from codedgd.services.job import Component, JobConfig
from codedgd.services.job.prepare import prepare
from codedgd.services.policies import Estimate, Policy, create
from codedgd.services.policies.base import JobContext
from codedgd.services.policies.lag import LagHistory
from codedgd.services.policies.lag import LazyPolicy as _Lazy
from codedgd.services.policies.lag_coded import GroupLag, LagCoded
from codedgd.services.sim import CostModel, Simulator
from tests.policies.test_rounds import DECODES_AT_N_MINUS_S, DEGENERATE_B

LAZY = ("lag-wk", "lag-ps", "g-lag", "lagc")


def context(
    n_rows: int = 100, step: float = 0.5, L: Callable[..., float] | None = None
) -> JobContext:
    return JobContext(n_rows=n_rows, step_size=step, smoothness=L or (lambda parts: 1.0))


# ------------------------------------------------------------------ the trigger arithmetic


def test_rhs_is_the_weighted_sum_of_the_last_D_moves() -> None:
    rng = np.random.default_rng(0)
    thetas = [rng.standard_normal(5) for _ in range(8)]
    D, xi, alpha, M = 3, 2.0, 0.1, 4
    history = LagHistory(D, xi)
    for k, theta in enumerate(thetas):
        history.observe(theta)
        moves = [
            float(np.sum((thetas[k - d + 1] - thetas[k - d]) ** 2))
            for d in range(1, D + 1)
            if k - d >= 0
        ]
        expected = (xi / D) * sum(moves) / (alpha**2 * M**2)
        assert history.rhs(alpha, M) == pytest.approx(expected, rel=1e-12)


def test_rhs_follows_the_step_size_schedule_of_the_round() -> None:
    """Under a decaying schedule the trigger divides by the step of round k, not the base."""
    policy = create("lag-ps", {"D": 2, "xi": 1.0})
    policy.plan(4, 4)

    def schedule(t: int) -> float:
        return 0.5 / (1.0 + t)

    policy.bind(JobContext(100, 0.5, lambda parts: 1.0, step_size_at=schedule))
    assert isinstance(policy, _Lazy)
    rng = np.random.default_rng(3)
    for t in range(5):
        policy.begin_round(t, rng.standard_normal(3))
        assert policy.rhs() == pytest.approx(policy.history.rhs(schedule(t), 4), rel=1e-12)
    assert policy.rhs() > 0 and policy.rhs() != policy.history.rhs(0.5, 4)


def test_the_job_context_carries_the_optimizer_schedule() -> None:
    config = JobConfig(
        workers=2,
        data=Component("synthetic", {"rows": 40, "dim": 3}),
        policy=Component("lag-ps", {}),
        optimizer={"lr": 0.2, "schedule": "inverse-sqrt"},
    )
    ctx = prepare(config, None).policy._ctx()  # type: ignore[attr-defined]
    assert ctx.step_at(0) == pytest.approx(0.2)
    assert ctx.step_at(3) == pytest.approx(0.2 / 2.0)


def test_worker_trigger_uploads_only_past_the_threshold_and_remembers_uploads() -> None:
    lazy = LazyUploader()
    g = np.array([3.0, 4.0])
    assert lazy.should_upload(g, {THRESHOLD_PARAM: -1.0})  # warm-up: always
    lazy.uploaded(g)
    near = g + np.array([0.1, 0.0])  # moved by 0.01 in squared norm
    assert not lazy.should_upload(near, {THRESHOLD_PARAM: 0.02})
    assert lazy.should_upload(near, {THRESHOLD_PARAM: 0.005})
    assert lazy.should_upload(near, {})  # no parameter: not a lazy round
    assert not LazyUploader.active({}) and LazyUploader.active({THRESHOLD_PARAM: 0.0})


def test_lag_wk_sends_the_threshold_in_payload_units_after_warm_up() -> None:
    policy = create("lag-wk", {"D": 2, "xi": 1.0})
    policy.plan(3, 3)
    n_rows, alpha = 50, 0.2
    policy.bind(context(n_rows, alpha))
    thetas = [np.zeros(2), np.array([1.0, 0.0]), np.array([1.0, 2.0]), np.array([2.0, 2.0])]
    grads = [np.ones(2) * (w + 1) for w in range(3)]
    for t, theta in enumerate(thetas):
        spec = policy.begin_round(t, theta)
        if t < 2:
            assert spec.params[THRESHOLD_PARAM] == -1.0
        else:
            moves = [np.sum((thetas[t - d + 1] - thetas[t - d]) ** 2) for d in (1, 2)]
            rhs = (1.0 / 2) * sum(moves) / (alpha**2 * 3**2)
            assert spec.params[THRESHOLD_PARAM] == pytest.approx(n_rows**2 * rhs)
        for w in range(3):
            policy.offer(w, grads[w])
        policy.decode()


def test_lag_ps_contacts_exactly_the_workers_whose_rule_fires() -> None:
    L = [0.1, 1.0, 10.0, 100.0]
    policy = create("lag-ps", {"D": 1, "xi": 1.0})
    policy.plan(4, 4)
    policy.bind(context(10, 0.5, lambda parts: L[parts[0]]))
    theta0, theta1, theta2 = np.zeros(3), np.array([0.1, 0.0, 0.0]), np.array([0.1, 0.05, 0.0])
    spec = policy.begin_round(0, theta0)  # warm-up: everyone
    assert spec.workers == (0, 1, 2, 3)
    for w in spec.workers:
        policy.offer(w, np.ones(3))
    policy.decode()
    spec = policy.begin_round(1, theta1)
    rhs = 1.0 * 0.01 / (0.5**2 * 16)
    expected = tuple(m for m in range(4) if L[m] ** 2 * 0.01 > rhs)
    assert spec.workers == expected and 0 not in expected and 3 in expected
    for w in spec.workers:
        policy.offer(w, np.full(3, 2.0))
    estimate = policy.decode()
    stale = [m for m in range(4) if m not in expected]
    np.testing.assert_array_equal(estimate.gradient, np.full(3, 2.0 * len(expected) + len(stale)))
    assert not estimate.exact  # stale uploads were reused
    policy.begin_round(2, theta2)


# ------------------------------------------------------------------ the aggregate invariant


def _watch(
    policy: Policy, unit_of: Callable[[int], int]
) -> list[tuple[Estimate, dict[int, np.ndarray]]]:
    """Wrap offer/decode: record each unit's latest upload, and each estimate with them."""
    latest: dict[int, np.ndarray] = {}
    seen: list[tuple[Estimate, dict[int, np.ndarray]]] = []
    offer, decode = policy.offer, policy.decode
    used_units: set[int] = set()

    def begin_hook(t: int, theta: np.ndarray) -> Any:
        used_units.clear()
        return begin(t, theta)

    def offer_hook(worker: int, payload: np.ndarray | None) -> bool:
        unit = unit_of(worker)
        done_before = policy.feasible(frozenset())
        result = offer(worker, payload)
        # The first message of a unit in a round (g-lag: of its group; lagc: until n−S
        # count) is the one kept; later ones of the same round are not.
        if payload is not None and unit not in used_units and not done_before:
            latest[unit] = payload.copy()
            used_units.add(unit)
        return result

    def decode_hook() -> Estimate:
        estimate = decode()
        seen.append((estimate, {u: v.copy() for u, v in latest.items()}))
        return estimate

    begin = policy.begin_round
    policy.begin_round = begin_hook  # type: ignore[method-assign]
    policy.offer = offer_hook  # type: ignore[method-assign]
    policy.decode = decode_hook  # type: ignore[method-assign]
    return seen


def _job(policy: str, params: dict[str, Any], stragglers: Component, rounds: int = 40) -> JobConfig:
    return JobConfig(
        workers=6,
        rounds=rounds,
        seed=3,
        data=Component("synthetic", {"rows": 900, "dim": 8}),
        model=Component("logistic", {"l2": 1e-3}),
        policy=Component(policy, params),
        stragglers=stragglers,
    )


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("lag-wk", {"D": 3}),
        ("lag-ps", {"D": 3}),
        ("g-lag", {"s": 1, "D": 3}),
        ("lagc", {"s": 1, "D": 3}),
    ],
)
def test_aggregate_is_the_sum_of_the_latest_uploads_at_every_round(
    name: str, params: dict[str, Any]
) -> None:
    config = _job(name, params, Component("exponential", {"mean": 0.05}))
    sim = Simulator(config, CostModel())
    policy = sim.prepared.policy
    unit_of: Callable[[int], int] = (
        (lambda w: w // (policy.s + 1)) if isinstance(policy, GroupLag) else (lambda w: w)
    )
    seen = _watch(policy, unit_of)
    result = sim.run()
    assert len(seen) == config.rounds
    skipped_some = False
    for t, (estimate, latest) in enumerate(seen):
        if isinstance(policy, LagCoded):
            F = estimate.workers_used
            vec = policy.code.decoding_vector(F)  # type: ignore[union-attr]
            expected = sum(a * latest[i] for a, i in zip(vec.a, F, strict=True))
            B_F = policy.code.B[list(F)]  # type: ignore[union-attr]
            np.testing.assert_allclose(vec.a @ B_F, np.ones(config.workers), atol=1e-9)
        else:
            expected = sum(latest[u] for u in sorted(latest))
            assert len(latest) == (len(policy.groups) if isinstance(policy, GroupLag) else 6)
        np.testing.assert_allclose(
            estimate.gradient, expected, rtol=1e-12, atol=1e-12, err_msg=f"round {t}"
        )
        skipped_some |= not estimate.exact
    # The invariant is not vacuous: some rounds reused stale messages.
    assert skipped_some
    records = result.records
    assert (
        sum(r.uploads for r in records) < sum(r.computations for r in records) or name != "lag-wk"
    )
    assert sum(r.uploads for r in records) < config.rounds * config.workers


# ------------------------------------------------------------------ lagc is exact


@pytest.mark.parametrize(("n", "s"), [(n, s) for n in range(3, 9) for s in (1, 2) if s < n])
def test_lagc_decodes_the_full_gradient_for_every_straggler_set(n: int, s: int) -> None:
    rng = np.random.default_rng(n * 10 + s)
    grads = rng.standard_normal((n, 7))
    target = grads.sum(axis=0)
    for F in itertools.combinations(range(n), n - s):
        policy = create("lagc", {"s": s}, seed=1)
        plan = policy.plan(n, n)
        policy.bind(context())
        policy.begin_round(0, np.zeros(7))
        done = False
        for i in F:
            wp = plan.workers[i]
            done = policy.offer(i, grads[list(wp.partitions)].T @ wp.coefficients[:, 0])
        assert done
        estimate = policy.decode()
        assert estimate.exact and estimate.workers_used == F
        np.testing.assert_allclose(estimate.gradient, target, rtol=1e-9, atol=1e-9)


def test_lagc_is_exact_for_the_stale_coded_messages_it_reuses() -> None:
    """Gradients that do not depend on θ: stale coded messages are still exact ones, so every
    round's decode must equal Σ_j g_j, whatever mix of stale and fresh messages it used."""
    n, s, dim = 8, 2, 5
    rng = np.random.default_rng(4)
    grads = rng.standard_normal((n, dim))
    L = rng.uniform(0.001, 0.3, size=n)
    policy = create("lagc", {"s": s, "D": 2, "xi": 5.0}, seed=2)
    plan = policy.plan(n, n)
    policy.bind(context(20, 0.3, lambda parts: float(L[parts[0]])))
    theta = np.zeros(dim)
    stale_rounds = 0
    for t in range(60):
        theta = theta + rng.standard_normal(dim) * 0.3 / (1 + t)
        spec = policy.begin_round(t, theta)
        order = rng.permutation(list(spec.workers)).tolist()
        done = policy.feasible(frozenset())
        for i in order:
            if done:
                break
            wp = plan.workers[i]
            done = policy.offer(i, grads[list(wp.partitions)].T @ wp.coefficients[:, 0])
        assert done
        estimate = policy.decode()
        stale_rounds += not estimate.exact
        np.testing.assert_allclose(estimate.gradient, grads.sum(axis=0), rtol=1e-9, atol=1e-9)
    assert stale_rounds > 10


def _degenerate_lagc() -> LagCoded:
    policy = create("lagc", {"s": 1}, seed=1)
    assert isinstance(policy, LagCoded)
    policy.plan(4, 4)
    assert policy.code is not None
    policy.code.B = DEGENERATE_B  # three of the four sets of n - s = 3 cannot decode
    policy.bind(context())
    return policy


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_lagc_waits_past_n_minus_s_when_the_first_messages_cannot_decode(
    order: tuple[int, ...],
) -> None:
    policy = _degenerate_lagc()
    grads = np.random.default_rng(5).standard_normal((4, 7))
    spec = policy.begin_round(0, np.zeros(7))  # warm-up: every worker is contacted
    assert spec.workers == (0, 1, 2, 3)
    done = False
    for w in order:
        if done:
            break  # the coordinator stops taking messages once the round decodes
        done = policy.offer(w, DEGENERATE_B[w] @ grads)
    assert done
    estimate = policy.decode()
    good_early = frozenset(order[:3]) in DECODES_AT_N_MINUS_S
    assert len(estimate.workers_used) == (3 if good_early else 4)
    assert policy.extended_rounds == (0 if good_early else 1)
    assert estimate.exact and estimate.residual <= policy.tol
    np.testing.assert_allclose(estimate.gradient, grads.sum(axis=0), rtol=1e-12, atol=1e-12)


def test_lagc_is_infeasible_once_no_one_is_left_to_fix_a_bad_residual() -> None:
    policy = _degenerate_lagc()
    grads = np.random.default_rng(5).standard_normal((4, 7))
    policy.begin_round(0, np.zeros(7))
    for w in (0, 1, 2):
        assert not policy.offer(w, DEGENERATE_B[w] @ grads)
    assert policy.feasible(frozenset({3}))
    assert not policy.feasible(frozenset())  # worker 3 lost: the round fails clearly
    with pytest.raises(DecodeError, match=r"exceeds tol.*no other worker is left"):
        policy.decode()
    assert policy.residual_errors == 1


# ------------------------------------------------------------------ LAG's own benchmark


def _lag_setup(policy: str, params: dict[str, Any] | None = None, rounds: int = 400) -> JobConfig:
    return JobConfig(
        workers=9,
        rounds=rounds,
        seed=0,
        data=Component("lag-synthetic"),
        model=Component("least-squares", {"l2": 0.0}),
        policy=Component(policy, params or {}),
    )


def _objective_error(records: Any, config: JobConfig) -> tuple[np.ndarray, np.ndarray]:
    ds = load_dataset("lag-synthetic", {}, seed=config.seed)
    X, y = ds.X_train, ds.y_train
    theta_star = np.linalg.lstsq(X, y, rcond=None)[0]
    f_star = 0.5 * float(np.mean((X @ theta_star - y) ** 2))
    f_0 = 0.5 * float(np.mean(y**2))
    losses = np.array([r.loss for r in records])
    uploads = np.cumsum([r.uploads for r in records])
    return (losses - f_star) / (f_0 - f_star), uploads


def lag_benchmark() -> dict[str, tuple[int, int, int]]:
    """Rounds, uploads and computations each policy needs to reach 1e-8 relative error."""
    out = {}
    for name in ("uncoded", "lag-wk", "lag-ps"):
        config = _lag_setup(name)
        records = Simulator(config, CostModel(compute="none")).run().records
        error, uploads = _objective_error(records, config)
        hit = np.flatnonzero(error <= 1e-8)
        assert hit.size, f"{name} never reached 1e-8 (best {error.min():.2e})"
        k = int(hit[0])
        computations = int(np.sum([r.computations for r in records[: k + 1]]))
        out[name] = (k + 1, int(uploads[k]), computations)
    return out


def test_lag_reaches_gradient_descents_accuracy_with_fewer_uploads() -> None:
    counts = lag_benchmark()
    gd_rounds, gd_uploads, _ = counts["uncoded"]
    assert gd_uploads == 9 * gd_rounds
    for name in ("lag-wk", "lag-ps"):
        assert counts[name][1] < gd_uploads / 2, counts  # the authors report several-fold savings
    # lag-wk computes every round; lag-ps saves the computations too.
    assert counts["lag-wk"][2] == 9 * counts["lag-wk"][0]
    assert counts["lag-ps"][2] == counts["lag-ps"][1]


def test_lag_synthetic_is_split_among_its_workers() -> None:
    prepared = prepare(_lag_setup("lag-ps"), None)
    assert [b.tolist() for b in prepared.blocks] == [
        list(range(50 * m, 50 * (m + 1))) for m in range(9)
    ]
    L = np.array(prepared.policy.smoothness)  # type: ignore[attr-defined]
    assert np.all(np.diff(L) > 0)  # heterogeneous: L_m grows with m
    with pytest.raises(ConfigError, match="use k = 9 partitions"):
        prepare(_lag_setup("lag-ps").replace(workers=6), None)


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize(
    ("name", "params", "n", "match"),
    [
        ("g-lag", {"s": 2}, 8, r"choose s in \{0,1,3,7\}"),
        ("lagc", {"s": 8}, 8, "choose s in 0..7"),
        ("lag-wk", {"D": 0}, 4, "D >= 1"),
        ("lag-ps", {"xi": -1.0}, 4, "xi >= 0"),
        ("lagc", {"h": "random"}, 4, "h="),
    ],
)
def test_impossible_lazy_plans_are_refused_with_the_valid_choices(
    name: str, params: dict[str, Any], n: int, match: str
) -> None:
    with pytest.raises((PlanError, ConfigError), match=match):
        create(name, params).plan(n, n)


def test_a_lazy_policy_without_data_says_so() -> None:
    policy = create("lag-ps")
    policy.plan(3, 3)
    with pytest.raises(DecodeError, match="bind"):
        policy.begin_round(0, np.zeros(2))


def test_lag_wk_refuses_a_skip_from_a_worker_that_never_uploaded() -> None:
    policy = create("lag-wk")
    policy.plan(2, 2)
    policy.bind(context())
    policy.begin_round(0, np.zeros(2))
    with pytest.raises(DecodeError, match="never uploaded"):
        policy.offer(0, None)


def test_every_lazy_policy_is_listed() -> None:
    from codedgd.services.policies import names

    assert set(LAZY) <= set(names())


def test_g_lag_supersedes_the_rest_of_a_group_once_one_member_arrived() -> None:
    policy = create("g-lag", {"s": 2})
    policy.plan(6, 6)
    policy.bind(context())
    spec = policy.begin_round(0, np.zeros(3))
    assert spec.workers == (0, 1, 2, 3, 4, 5)
    assert policy.superseded() == frozenset()
    assert not policy.offer(4, np.ones(3))
    assert policy.superseded() == frozenset({3, 5})  # group {3, 4, 5} is served
    assert policy.offer(0, np.ones(3))
    assert policy.superseded() == frozenset({1, 2, 3, 5})
    np.testing.assert_array_equal(policy.decode().gradient, np.full(3, 2.0))


# ------------------------------------------------------------------ riding along


def test_ride_adds_the_units_near_their_trigger_to_a_round_that_asks_someone() -> None:
    L = [0.1, 0.4, 1.0, 10.0]
    rhs = 1.0 * 0.01 / (0.5**2 * 16)  # one move of θ, ‖Δθ‖² = 0.01 (as the test above)
    lhs = [m**2 * 0.01 for m in L]  # every worker's θ̂ is θ0: ‖θ̂ − θ1‖² = 0.01
    for ride, expected in ((1.0, (2, 3)), (0.5, (1, 2, 3)), (0.0, (0, 1, 2, 3))):
        assert all((lhs[m] > rhs) == (m in (2, 3)) for m in range(4))  # LAG's own rule
        assert all((lhs[m] > ride * rhs) == (m in expected) for m in range(4))
        policy = create("lag-ps", {"D": 1, "xi": 1.0, "ride": ride})
        policy.plan(4, 4)
        policy.bind(context(10, 0.5, lambda parts: L[parts[0]]))
        spec = policy.begin_round(0, np.zeros(3))  # warm-up: everyone
        for w in spec.workers:
            policy.offer(w, np.ones(3))
        policy.decode()
        assert policy.begin_round(1, np.array([0.1, 0.0, 0.0])).workers == expected


def test_ride_adds_no_one_to_a_round_that_asks_no_one() -> None:
    L = [1.0, 1.0, 1.0, 1.0]
    policy = create("lag-ps", {"D": 1, "xi": 1.0, "ride": 0.0})
    policy.plan(4, 4)
    policy.bind(context(10, 0.5, lambda parts: L[parts[0]]))
    theta = np.zeros(3)
    spec = policy.begin_round(0, theta)
    for w in spec.workers:
        policy.offer(w, np.ones(3))
    policy.decode()
    # θ moved, but the workers' θ̂ is where θ is now: no trigger fires, and ride = 0 asks
    # every worker only in a round that asks someone anyway.
    assert policy.begin_round(1, theta).workers == ()


def test_riding_g_lag_asks_a_superset_of_lags_groups_and_reaches_the_same_optimum() -> None:
    config = _job("g-lag", {"s": 1, "D": 3, "ride": 0.5}, Component("exponential", {"mean": 0.05}))
    config = config.replace(rounds=300)
    sim = Simulator(config, CostModel())
    policy = sim.prepared.policy
    assert isinstance(policy, GroupLag)
    twin = create("g-lag", {"s": 1, "D": 3})  # LAG's own rule, from the same state
    assert isinstance(twin, GroupLag)
    twin.plan(config.workers, len(sim.prepared.blocks))
    twin.bind(policy._ctx())
    begin = policy.begin_round
    rode: list[int] = []

    def begin_hook(t: int, theta: np.ndarray) -> Any:
        twin.load_state(policy.state())
        own = set(twin.begin_round(t, theta).workers)
        spec = begin(t, theta)
        asked = set(spec.workers)
        assert own <= asked, f"round {t}: LAG's groups {own} not all asked ({asked})"
        rode.append(len(asked) - len(own))
        return spec

    policy.begin_round = begin_hook  # type: ignore[method-assign]
    records = sim.run().records
    assert sum(rode) > 0  # some groups rode along
    # Riding along keeps LAG's convergence: the same optimum as gradient descent.
    gd = simulate_rounds(config.replace(policy=Component("uncoded", {}), rounds=2000))
    assert records[-1].loss == pytest.approx(gd[-1].loss, rel=1e-7)


def simulate_rounds(config: JobConfig) -> list[Any]:
    return list(Simulator(config, CostModel()).run().records)


def test_lagc_riders_are_contacted_count_at_once_and_never_hold_a_round() -> None:
    """lagc with ride: each round contacts a superset of what LAG's rule contacts from the
    same state; a rider counts at once with its last message (as an untriggered worker
    does), a fresh one replaces it when it comes in time, and the round ends at the same
    arrival of a triggered worker as under LAG's rule. Every decode is exact (gradients
    that do not depend on θ: stale coded messages are exact ones)."""
    n, s, dim = 8, 2, 5
    rng = np.random.default_rng(4)
    grads = rng.standard_normal((n, dim))
    L = rng.uniform(0.001, 0.3, size=n)
    ctx = context(20, 0.3, lambda parts: float(L[parts[0]]))
    policy = create("lagc", {"s": s, "D": 2, "xi": 5.0, "ride": 0.5}, seed=2)
    twin = create("lagc", {"s": s, "D": 2, "xi": 5.0}, seed=2)  # LAG's rule
    assert isinstance(policy, LagCoded) and isinstance(twin, LagCoded)
    plan = policy.plan(n, n)
    twin.plan(n, n)
    policy.bind(ctx)
    twin.bind(ctx)
    theta = np.zeros(dim)
    rode = refreshed = 0
    for t in range(60):
        theta = theta + rng.standard_normal(dim) * 0.3 / (1 + t)
        twin.load_state(policy.state())
        own = set(twin.begin_round(t, theta).workers)
        asked = set(policy.begin_round(t, theta).workers)
        assert own <= asked and (own or not asked), f"round {t}: {own} vs {asked}"
        riders = asked - own
        rode += len(riders)
        done = policy.feasible(frozenset())
        assert done == twin.feasible(frozenset())
        for i in rng.permutation(sorted(asked)).tolist():
            if done:
                break
            wp = plan.workers[i]
            message = grads[list(wp.partitions)].T @ wp.coefficients[:, 0]
            done = policy.offer(i, message)
            if i in riders:  # its fresh message replaces its stale one
                refreshed += 1
                latest = policy.latest(i)
                assert latest is not None and np.array_equal(latest, message)
                assert i in policy._fresh
            else:
                assert done == twin.offer(i, message), f"round {t}: worker {i}"
        assert done
        estimate = policy.decode()
        np.testing.assert_allclose(estimate.gradient, grads.sum(axis=0), rtol=1e-9, atol=1e-9)
        assert estimate.workers_used == twin.decode().workers_used  # (riders counted)
    assert rode > 10 and refreshed > 0, (rode, refreshed)
    assert policy.extended_rounds == twin.extended_rounds


def test_lagc_does_not_wait_for_riders_when_the_triggered_messages_cannot_decode() -> None:
    # A round whose triggered workers have all answered but whose messages cannot decode
    # within tol has no one left to wait for: a rider counts already, its arrival cannot
    # change the set. (A code whose every set fails, so the round ends that way.)
    policy = _degenerate_lagc()
    assert policy.code is not None
    policy.code.B = np.zeros_like(DEGENERATE_B)
    grads = np.random.default_rng(5).standard_normal((4, 7))
    policy.begin_round(0, np.zeros(7))  # warm-up: every worker, each leaves a message
    assert [policy.offer(w, grads[w]) for w in range(4)] == [False, False, False, True]
    triggered = np.array([True, True, True, False])
    policy._ps_riders = lambda smoothness: (triggered, ~triggered)  # type: ignore[method-assign]
    assert policy.begin_round(1, np.ones(7)).workers == (0, 1, 2, 3)
    assert not policy.offer(0, grads[0]) and not policy.offer(1, grads[1])
    assert policy.offer(2, grads[2])  # worker 3 rides along: not waited for
    with pytest.raises(DecodeError, match="exceeds tol"):
        policy.decode()


@pytest.mark.parametrize("ride", [-0.1, 1.5, float("nan")])
def test_a_ride_outside_zero_to_one_is_refused(ride: float) -> None:
    for name in ("lag-ps", "g-lag", "lagc"):
        with pytest.raises(ConfigError, match=r"ride=.* is not a fraction in \[0, 1\]"):
            create(name, {"ride": ride})
